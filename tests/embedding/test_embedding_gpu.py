"""Sharded EmbeddingBag on the GPU (NVSHMEM store; mgg/kernels/embedding_bag.cu) vs torch in
float64.

Inference (no grad) goes through the fused get+pool kernel, training through the row-gather kernel
plus torch's embedding_bag. Runs alone (P = 1) and under `mpirun -np 2 python -m pytest
tests/embedding/test_embedding_gpu.py` (P = 2: every rank looks up its own batch, rows owned by both
GPUs). Skipped elsewhere.
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


def _reference(table: torch.Tensor, idx, off, mode, psw=None) -> torch.Tensor:
    return torch.nn.functional.embedding_bag(idx, table.double(), off, mode=mode,
                                             per_sample_weights=None if psw is None else psw.double())


@pytest.mark.parametrize("mode,psw", [("sum", False), ("sum", True), ("mean", False), ("max", False)])
@pytest.mark.parametrize("dim", [1, 16, 70])
def test_fused_inference_equals_torch(mode, psw, dim):
    comm = world()
    with _freed(ShardedEmbeddingBag(N, dim, mode, comm=comm, seed=3, backend="gpu")) as emb:
        emb.eval()
        idx, off = _batch(100 + comm.rank, N)
        w = torch.rand(len(idx), generator=torch.Generator().manual_seed(7)) if psw else None
        _poison_allocator(len(off) * dim * 4)
        with torch.no_grad():
            out = emb(idx, off, w)
        assert out.is_cuda and out.shape == (len(off), dim)
        ref = _reference(init_table(N, dim, seed=3), idx, off, mode, w)
        np.testing.assert_allclose(out.cpu().double().numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
        assert (out[5] == 0).all()  # an empty bag pools to zeros


def test_training_forward_equals_torch_two_tables():  # width 70: rows padded to 72 in the store
    comm = world()
    tables = [TableConfig(N, 12, "sum"), TableConfig(3000, 70, "mean", sharding="hash")]
    with _freed(MultiTableEmbeddingBag(tables, comm=comm, seed=11, backend="gpu")) as emb:
        emb.train()
        b0, b1 = _batch(200 + comm.rank, N), _batch(300 + comm.rank, 3000)
        outs = emb([b0[0], b1[0]], [b0[1], b1[1]])
        for t, ((idx, off), cfg) in enumerate(zip([b0, b1], tables)):
            ref = _reference(init_table(cfg.num_embeddings, cfg.embedding_dim, seed=11 + t), idx, off, cfg.mode)
            np.testing.assert_allclose(outs[t].detach().cpu().double().numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_ids_on_the_gpu_stay_there_and_are_checked():
    """Ids given on the GPU give the same bags as ids on the CPU (the fused path validates and
    locates them on the device), and a bad id on the GPU is still a clear IndexError/ValueError."""
    comm = world()
    with _freed(ShardedEmbeddingBag(N, 24, "sum", comm=comm, seed=5, backend="gpu")) as emb:
        emb.eval()
        idx, off = _batch(300 + comm.rank, N)
        with torch.no_grad():
            cpu_out = emb(idx, off)
            gpu_out = emb(idx.cuda(), off.cuda())
            torch.testing.assert_close(gpu_out, cpu_out, rtol=0, atol=0)
            bad = idx.clone()
            bad[17] = N
            with pytest.raises(IndexError, match=f"index {N} out of range"):
                emb(bad.cuda(), off.cuda())
            wrong = off.clone()
            wrong[1] = len(idx) + 1  # offsets[2] < offsets[1]
            with pytest.raises(ValueError, match="non-decreasing"):
                emb(idx.cuda(), wrong.cuda())
