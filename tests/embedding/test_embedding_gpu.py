"""Sharded EmbeddingBag on the GPU (NVSHMEM store; mgg/kernels/embedding_bag.cu) vs torch in
float64.

Inference (no grad) goes through the one-launch lookup kernel, training through the device-side
unique rows, the row-gather kernel and torch's embedding_bag. Runs alone (P = 1) and under
`mpirun -np 2 python -m pytest tests/embedding/test_embedding_gpu.py` (P = 2: every rank looks up
its own batch, rows owned by both GPUs). Skipped elsewhere.
"""
import contextlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

from mgg.embedding import MultiTableEmbeddingBag, ShardedEmbeddingBag, TableConfig, init_table  # noqa: E402
from mgg.runtime import world  # noqa: E402

N = 5000


def _batch(seed: int, n_rows: int, n: int = 700, bags: int = 64):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_rows, (n,), generator=g)
    off = torch.cat([torch.tensor([0]), torch.sort(torch.randint(0, n + 1, (bags - 1,), generator=g)).values])
    off[5] = off[6] = off[4]  # empty bags
    return idx, off


@contextlib.contextmanager
def _freed(emb):
    """`emb`, freed on every rank when the block ends, also when an assertion fails on one: the
    free is collective, and a rank that skipped it would pair its next allocation with the other
    ranks' free, failing every later test."""
    try:
        yield emb
    finally:
        emb.free()


def _poison_allocator(nbytes: int) -> None:
    """Leave NaNs in the caching allocator's free blocks, so outputs a kernel fails to write show."""
    t = torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    del t


def _reference(table: torch.Tensor, idx, off, mode, psw=None, include_last_offset=False) -> torch.Tensor:
    """torch in float64; with include_last_offset the ids after offsets[-1] belong to no bag (torch
    itself would pool them into the last bag)."""
    if include_last_offset:
        idx, psw = idx[: int(off[-1])], None if psw is None else psw[: int(off[-1])]
    return torch.nn.functional.embedding_bag(idx, table.double(), off, mode=mode,
                                             per_sample_weights=None if psw is None else psw.double(),
                                             include_last_offset=include_last_offset)


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not torch.isnan(out).any()
    np.testing.assert_allclose(out.detach().cpu().double().numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,psw", [("sum", False), ("sum", True), ("mean", False), ("max", False)])
@pytest.mark.parametrize("dim", [1, 16, 64, 70, 200])
@pytest.mark.parametrize("sharding", ["range", "hash"])
def test_lookup_equals_torch(mode, psw, dim, sharding):
    comm = world()
    with _freed(ShardedEmbeddingBag(N, dim, mode, sharding, comm=comm, seed=3, backend="gpu")) as emb:
        emb.eval()
        idx, off = _batch(100 + comm.rank, N)
        w = torch.rand(len(idx), generator=torch.Generator().manual_seed(7)) if psw else None
        _poison_allocator(len(off) * dim * 4)
        with torch.no_grad():
            out = emb(idx.cuda(), off.cuda(), None if w is None else w.cuda())
        assert out.is_cuda and out.shape == (len(off), dim)
        _close(out, _reference(init_table(N, dim, seed=3), idx, off, mode, w))
        assert (out[5] == 0).all()  # an empty bag pools to zeros


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("mode", ["sum", "max"])
def test_lookup_include_last_offset_and_id_dtypes(id_dtype, mode):
    """include_last_offset (ids after offsets[-1] belong to no bag), int32 ids and offsets read as
    they are, a trailing empty bag."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 24, mode, "hash", comm=comm, seed=4, backend="gpu",
                                    include_last_offset=True)) as emb:
        emb.eval()
        idx, off = _batch(150 + comm.rank, N)
        off = torch.cat([off.clamp(max=650), torch.tensor([650, 650])])  # 50 ids after the last bag; the last bag empty
        w = torch.rand(len(idx), generator=torch.Generator().manual_seed(8)) if mode == "sum" else None
        _poison_allocator((len(off) - 1) * 24 * 4)
        with torch.no_grad():
            out = emb(idx.to(id_dtype).cuda(), off.to(id_dtype).cuda(), None if w is None else w.cuda())
        assert out.shape == (len(off) - 1, 24)
        _close(out, _reference(init_table(N, 24, seed=4), idx, off, mode, w, include_last_offset=True))


def test_lookup_two_dim_input_and_host_ids():
    """[B, L] indices without offsets, and ids given on the host (copied once)."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 40, "mean", comm=comm, seed=6, backend="gpu")) as emb:
        emb.eval()
        idx = torch.randint(0, N, (33, 5), generator=torch.Generator().manual_seed(200 + comm.rank))
        with torch.no_grad():
            out = emb(idx.cuda())
            host = emb(idx)
        ref = _reference(init_table(N, 40, seed=6), idx, None, "mean")
        _close(out, ref)
        torch.testing.assert_close(host, out, rtol=0, atol=0)


def test_lookup_multi_table_widths():
    comm = world()
    tables = [TableConfig(N, 12, "sum"), TableConfig(3000, 70, "mean", sharding="hash"), TableConfig(77, 5, "max")]
    with _freed(MultiTableEmbeddingBag(tables, comm=comm, seed=11, backend="gpu")) as emb:
        emb.eval()
        batches = [_batch(400 + 3 * comm.rank + t, cfg.num_embeddings) for t, cfg in enumerate(tables)]
        with torch.no_grad():
            outs = emb([b[0].cuda() for b in batches[:2]] + [None], [b[1].cuda() for b in batches[:2]] + [None])
        assert outs[2] is None
        for t in range(2):
            cfg = tables[t]
            ref = _reference(init_table(cfg.num_embeddings, cfg.embedding_dim, seed=11 + t), *batches[t], cfg.mode)
            _close(outs[t], ref)


def test_training_forward_and_gradient_equal_torch():  # width 70: rows padded to 72 in the store
    comm = world()
    tables = [TableConfig(N, 12, "sum"), TableConfig(3000, 70, "mean", sharding="hash"), TableConfig(500, 9, "max")]
    with _freed(MultiTableEmbeddingBag(tables, comm=comm, seed=11, backend="gpu")) as emb:
        emb.train()

        def batches(rank):
            return [_batch(200 + 10 * rank + t, cfg.num_embeddings) for t, cfg in enumerate(tables)]

        mine = batches(comm.rank)
        outs = emb([b[0].cuda() for b in mine], [b[1].cuda() for b in mine])
        weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(t), dtype=torch.float64)
                   for t, o in enumerate(outs)]
        sum((o.double() * w.cuda()).sum() for o, w in zip(outs, weights)).backward()
        grads = emb.gather_gradient(emb.reduce_gradients())
        refs = [init_table(c.num_embeddings, c.embedding_dim, seed=11 + t).double().requires_grad_()
                for t, c in enumerate(tables)]
        for rank in range(comm.size):  # the dense gradient of every rank's batch
            for t, (idx, off) in enumerate(batches(rank)):
                ref = _reference(refs[t], idx, off, tables[t].mode)
                if rank == comm.rank:
                    _close(outs[t], ref.detach())
                (ref * weights[t]).sum().backward()
        for t in range(len(tables)):
            np.testing.assert_allclose(grads[t].double().numpy(), refs[t].grad.numpy(), rtol=1e-5, atol=1e-5)


def test_device_gradients_are_deterministic_and_adagrad_equals_the_cpu_store():
    """The GPU store's gradients move on the device (mgg.embedding.grad_exchange): the same batch
    twice gives bit-equal summed gradients, and one row-wise Adagrad step leaves every table
    equal to the same step on the CPU store (MPI), tables of two widths and both shardings."""
    from mgg.embedding import RowWiseAdagrad

    comm = world()
    tables = [TableConfig(N, 12, "sum"), TableConfig(3000, 9, "mean", sharding="hash")]

    def step(backend, repeat=1):
        with _freed(MultiTableEmbeddingBag(tables, comm=comm, seed=5, backend=backend)) as emb:
            emb.train()
            opt = RowWiseAdagrad(emb, lr=0.1)
            mine = [_batch(300 + 10 * comm.rank + t, c.num_embeddings) for t, c in enumerate(tables)]
            dev = "cuda" if backend == "gpu" else "cpu"
            grads = []
            for _ in range(repeat):
                outs = emb([b[0].to(dev) for b in mine], [b[1].to(dev) for b in mine])
                sum((o * (t + 1.5)).sum() for t, o in enumerate(outs)).backward()
                g = emb.reduce_gradients()
                grads.append((g.rows_numpy(), g.values.cpu()))
            outs = emb([b[0].to(dev) for b in mine], [b[1].to(dev) for b in mine])
            sum((o * (t + 1.5)).sum() for t, o in enumerate(outs)).backward()
            opt.step()
            return grads, [emb.gather_table(t) for t in range(len(tables))]

    (g1, g2), gpu_tables = step("gpu", repeat=2)
    np.testing.assert_array_equal(g1[0], g2[0])
    assert torch.equal(g1[1], g2[1])
    _, cpu_tables = step("cpu")
    for a, b in zip(gpu_tables, cpu_tables):
        np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), rtol=1e-5, atol=1e-6)


def test_training_include_last_offset_with_weights():
    """Ids after offsets[-1] neither pool nor receive a gradient (with per-sample weights)."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 16, "sum", comm=comm, seed=9, backend="gpu", include_last_offset=True)) as emb:
        emb.train()
        idx, off = _batch(500 + comm.rank, N)
        off = torch.cat([off.clamp(max=690), torch.tensor([690])])  # ids 690..699 after the last bag
        idx[690:] = 4999 - comm.rank  # rows used only after the last bag
        idx[:690][idx[:690] >= 4998] = 0
        w = torch.rand(len(idx), generator=torch.Generator().manual_seed(9))
        out = emb(idx.cuda(), off.cuda(), w.cuda())
        out.sum().backward()
        grads = emb.gather_gradient(emb.reduce_gradients())[0]
        _close(out, _reference(init_table(N, 16, seed=9), idx, off, "sum", w, include_last_offset=True))
        assert (grads[4998:] == 0).all()


def test_bad_ids_raise_one_clear_error():
    """Negative ids and ids >= N on the GPU raise IndexError naming the table and the value (the
    smallest negative one, else the largest), before any result is returned; offsets errors are
    the host checks' ValueErrors; the lookup is clean again afterwards."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 24, "sum", comm=comm, seed=5, backend="gpu")) as emb:
        emb.eval()
        idx, off = _batch(300 + comm.rank, N)
        with torch.no_grad():
            for dtype in (torch.int32, torch.int64):
                bad = idx.clone()
                bad[17], bad[400] = N, N + 7
                with pytest.raises(IndexError, match=rf"table 0: index {N + 7} out of range \[0, {N}\)"):
                    emb(bad.to(dtype).cuda(), off.cuda())
                bad[3] = -2
                bad[300] = -9
                with pytest.raises(IndexError, match=r"index -9 out of range"):
                    emb(bad.to(dtype).cuda(), off.cuda())
            wrong = off.clone()
            wrong[1] = len(idx) + 1  # offsets[2] < offsets[1]
            with pytest.raises(ValueError, match="non-decreasing"):
                emb(idx.cuda(), wrong.cuda())
            with pytest.raises(ValueError, match="start at 0"):
                emb(idx.cuda(), (off + 1).cuda())
            emb.train()
            bad = idx.clone()
            bad[5] = -1
            with torch.enable_grad(), pytest.raises(IndexError, match="index -1 out of range"):
                emb(bad.cuda(), off.cuda())
            emb.eval()
            _close(emb(idx.cuda(), off.cuda()), _reference(init_table(N, 24, seed=5), idx, off, "sum"))


def test_deferred_checks_mark_bad_bags_and_raise_when_asked():
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 8, "sum", comm=comm, seed=5, backend="gpu", checks="deferred")) as emb:
        emb.eval()
        idx, off = _batch(310 + comm.rank, N)
        b = next(i for i in range(7, len(off) - 1) if off[i + 1] > off[i])  # a bag with ids
        bad = idx.clone()
        bad[int(off[b])] = N + 3  # its first id
        with torch.no_grad():
            before = emb.counters.snapshot()
            out = emb(bad.cuda(), off.cuda())
            after = emb.counters.snapshot()
        assert after["host_syncs"] == before["host_syncs"]  # nothing read back
        assert torch.isnan(out[b]).all()
        ok = torch.ones(len(off), dtype=torch.bool)
        ok[b] = False
        _close(out[ok.cuda()], _reference(init_table(N, 8, seed=5), idx, off, "sum")[ok])
        with pytest.raises(IndexError, match=rf"table 0: index {N + 3} out of range"):
            emb.raise_input_errors()
        emb.raise_input_errors()  # cleared


def test_counters_one_launch_one_sync_and_remote_rows():
    """An inference call on ids already on the GPU is one launch; checks "sync" add one copy and
    one synchronisation, "deferred" none; no barrier. The kernel counts the rows it read from
    other PEs: exactly the ids whose owner is another rank."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 64, "sum", "hash", comm=comm, seed=5, backend="gpu")) as emb:
        emb.eval()
        idx, off = _batch(320 + comm.rank, N)
        ids, offs = idx.cuda(), off.cuda()
        with torch.no_grad():
            emb(ids, offs)  # loads the module
            rows0, remote0, bytes0 = emb.rows_read()
            emb.counters.reset()
            for _ in range(3):
                emb(ids, offs)
            c = emb.counters.snapshot()
            assert c == {"calls": 3, "launches": 3, "host_syncs": 3, "h2d_copies": 0, "d2h_copies": 3, "barriers": 0}
            rows, remote, nbytes = emb.rows_read()
            emb.checks = "deferred"
            emb.counters.reset()
            emb(ids, offs)
            assert emb.counters.snapshot()["host_syncs"] == 0 and emb.counters.launches == 1
        assert rows - rows0 == 3 * len(idx)
        other = int((idx % comm.size != comm.rank).sum())
        assert remote - remote0 == 3 * other
        assert nbytes - bytes0 == 3 * other * 64 * 4


def test_lookup_replays_from_a_cuda_graph():
    """With checks "deferred" the lookup is one launch and nothing read back: it can be captured."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 32, "mean", comm=comm, seed=5, backend="gpu", checks="deferred")) as emb:
        emb.eval()
        idx, off = _batch(330 + comm.rank, N)
        ids, offs = idx.cuda(), off.cuda()
        with torch.no_grad():
            emb(ids, offs)  # module loaded outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = emb(ids, offs)
            other, _ = _batch(331 + comm.rank, N)
            ids.copy_(other.cuda())
            graph.replay()
            torch.cuda.synchronize()
        _close(out, _reference(init_table(N, 32, seed=5), other, off, "mean"))
        emb.raise_input_errors()
