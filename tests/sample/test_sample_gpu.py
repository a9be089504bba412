"""Sampled mini-batch path on the GPU (mgg/kernels/sample.cu through mgg.sample).

Runs alone (P = 1) and under `mpirun -np 2 python -m pytest tests/sample/test_sample_gpu.py` (P =
2). Checked against independent host computations: sampled edges exist in the CSR with the right
multiplicity and count, uniformity on a star, Fused-Map round trip and equality with torch.unique as
sets, host-tier and symmetric-store gathers equal the source rows (outputs poisoned first where we
allocate them).
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.sample_gpu import fused_map_cuda, gather_host_rows_cuda, sample_neighbors_cuda  # noqa: E402
from mgg.sample import HostTierFeatures, NeighborLoader, fused_map, overlap_matrix, sample_neighbors  # noqa: E402
from mgg.testing.graphs import random_csr  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


def _check_sample(indptr, indices, seeds, fanout, ptr, nbr):
    ptr, nbr = ptr.cpu().numpy(), nbr.cpu().numpy()
    for i, s in enumerate(seeds):
        row = indices[indptr[s]:indptr[s + 1]]
        got = nbr[ptr[i]:ptr[i + 1]]
        want = len(row) if fanout < 0 else min(len(row), fanout)
        assert len(got) == want
        vals, cnt = np.unique(row, return_counts=True)
        gv, gc = np.unique(got, return_counts=True)
        pos = np.searchsorted(vals, gv)
        assert np.all(pos < len(vals)) and np.all(vals[np.minimum(pos, len(vals) - 1)] == gv), "sampled a non-edge"
        assert np.all(gc <= cnt[pos]), "an edge position was sampled twice"


@pytest.mark.parametrize("fanout", [1, 5, 25, -1])
@pytest.mark.parametrize("pinned", [False, True])
def test_sample_neighbors_valid(fanout, pinned):
    indptr, indices = random_csr(3000, 60000, seed=fanout + 3)
    seeds = np.random.default_rng(0).choice(3000, 700, replace=False)
    ip, ix = torch.from_numpy(indptr), torch.from_numpy(indices)
    if pinned:  # zero-copy CSR in page-locked host memory
        ip, ix = ip.pin_memory(), ix.pin_memory()
    else:
        ip, ix = ip.to(DEV), ix.to(DEV)
    ptr, nbr = sample_neighbors_cuda(ip, ix, torch.from_numpy(seeds).to(DEV), fanout, seed=7)
    _check_sample(indptr, indices, seeds, fanout, ptr, nbr)
    # reproducible: same seed, same sample; another seed, another one
    ptr2, nbr2 = sample_neighbors_cuda(ip, ix, torch.from_numpy(seeds).to(DEV), fanout, seed=7)
    assert torch.equal(nbr, nbr2)
    if fanout in (1, 5):
        _, nbr3 = sample_neighbors_cuda(ip, ix, torch.from_numpy(seeds).to(DEV), fanout, seed=8)
        assert not torch.equal(nbr, nbr3)


def test_sample_uniform_on_a_star():
    """Node 0 has 50 distinct neighbors; fanout 10 over 4000 draws: each neighbor ~800 times."""
    deg, k, reps = 50, 10, 4000
    indptr = torch.tensor([0, deg] + [deg] * deg, dtype=torch.int64, device=DEV)
    indices = torch.arange(1, deg + 1, dtype=torch.int64, device=DEV)
    seeds = torch.zeros(reps, dtype=torch.int64, device=DEV)  # the same seed node many times
    ptr, nbr = sample_neighbors_cuda(indptr, indices, seeds, k, seed=123)
    nb = nbr.view(reps, k).cpu().numpy()
    assert all(len(set(r)) == k for r in nb)
    counts = np.bincount(nb.ravel(), minlength=deg + 1)[1:]
    expected = reps * k / deg
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 100.0, chi2  # 49 dof: mean 49, p(chi2 > 100) ~ 2e-5


def test_mgg_sample_neighbors_dispatches_to_cuda():
    indptr, indices = random_csr(500, 8000, seed=2)
    seeds = torch.arange(0, 500, 3, device=DEV)
    g = torch.Generator().manual_seed(0)
    ptr, nbr = sample_neighbors(torch.from_numpy(indptr).to(DEV), torch.from_numpy(indices).to(DEV), seeds, 4, g)
    assert ptr.is_cuda and nbr.is_cuda
    _check_sample(indptr, indices, seeds.cpu().numpy(), 4, ptr, nbr)


@pytest.mark.parametrize("n,universe", [(1, 10), (1000, 50), (200000, 10 ** 9), (300000, 5000)])
def test_fused_map_round_trip(n, universe):
    rng = np.random.default_rng(n)
    seeds = rng.choice(universe, min(64, universe // 2, n), replace=False)
    ids = np.concatenate([seeds, rng.integers(0, universe, n)])
    t = torch.from_numpy(ids).to(DEV)
    n_id, local = fused_map_cuda(t, len(seeds))
    assert torch.equal(n_id[local], t)
    assert torch.equal(n_id[: len(seeds)], t[: len(seeds)])           # seeds first, in order
    assert n_id.numel() == len(np.unique(ids))                          # unique
    assert torch.equal(torch.sort(n_id).values, torch.unique(t))
    # first-occurrence order (deterministic although the table is filled concurrently)
    _, first = np.unique(ids, return_index=True)
    assert np.array_equal(n_id.cpu().numpy(), ids[np.sort(first)])
    a, b = fused_map(t, len(seeds))
    assert torch.equal(a, n_id) and torch.equal(b, local)


@pytest.mark.parametrize("width", [1, 3, 32, 37, 100, 128])
def test_gather_host_rows_zero_copy(width):
    x = torch.randn(5000, width).pin_memory()
    rows = torch.from_numpy(np.random.default_rng(width).integers(0, 5000, 3000)).to(DEV)
    out = gather_host_rows_cuda(x, rows)
    assert torch.equal(out.cpu(), x[rows.cpu()])
    # a strided view (row stride > width) is read with its stride
    big = torch.randn(100, width + 5).pin_memory()
    view = big[:, :width]
    r = torch.arange(0, 100, 7, device=DEV)
    assert torch.equal(gather_host_rows_cuda(view, r).cpu(), view[r.cpu()])


def test_host_tier_registered_memory():
    x = np.random.default_rng(1).standard_normal((4000, 52)).astype(np.float32)
    src = HostTierFeatures(x, None, device=DEV)
    try:
        ids = torch.from_numpy(np.random.default_rng(2).integers(0, 4000, 2500)).to(DEV)
        got = src.gather(ids)
        assert got.is_cuda and np.array_equal(got.cpu().numpy(), x[ids.cpu().numpy()])
    finally:
        src.close()


def test_loader_on_gpu_blocks_valid():
    indptr, indices = random_csr(2000, 30000, seed=4)
    x = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 5, 2000)
    loader = NeighborLoader((indptr, indices), x, y, np.arange(0, 2000, 2), [5, 3], batch_size=256,
                            device=DEV)
    A = {(int(t), int(s)) for t in range(2000) for s in indices[indptr[t]:indptr[t + 1]]}
    n = 0
    for batch in loader:
        n += 1
        assert batch.x.is_cuda
        nid = batch.n_id.cpu().numpy()
        assert np.array_equal(batch.x.cpu().numpy(), x[nid])
        assert np.array_equal(batch.y.cpu().numpy(), y[batch.seeds.cpu().numpy()])
        for blk in batch.blocks:
            ptr, col = blk.ptr.cpu().numpy(), blk.col.cpu().numpy()
            for i in range(blk.n_dst):
                for c in col[ptr[i]:ptr[i + 1]]:
                    assert (int(nid[i]), int(nid[c])) in A
    assert n == len(loader)


def test_store_features_nvshmem_gather():
    """Rows of every rank fetched with NVSHMEM gets equal the global rows (P = 1 or 2)."""
    pytest.importorskip("nvshmem.core")
    from mgg.runtime import world
    from mgg.graph import make_store
    from mgg.runtime.partition import partition_ranges
    from mgg.sample import StoreFeatures

    comm = world()
    indptr, _ = random_csr(3000, 40000, seed=9)
    bounds = partition_ranges(indptr, comm.size)
    x = np.random.default_rng(3).standard_normal((3000, 24)).astype(np.float32)
    store = make_store(comm, "gpu")
    src = StoreFeatures.from_global(store, bounds, x)
    try:
        ids = np.random.default_rng(10 + comm.rank).integers(0, 3000, 4000)
        got = src.gather(torch.from_numpy(ids).to(DEV))
        assert got.is_cuda and np.array_equal(got.cpu().numpy(), x[ids])
        if comm.size > 1:
            assert src.last.rows_remote > 0
    finally:
        src.close()


def _batches(loader):
    out = []
    for batch in loader:
        # busy the caller's stream first: a hand-over without the stream wait would read x early
        a = torch.randn(1024, 1024, device=loader.device)
        for _ in range(8):
            a = a @ a / 32
        out.append((batch.n_id.cpu().numpy(), batch.x.cpu().numpy(), batch.y.cpu().numpy(),
                    [(b.ptr.cpu().numpy(), b.col.cpu().numpy()) for b in batch.blocks]))
    return out


@pytest.mark.parametrize("tier", ["tensor", "host", "store"])
@pytest.mark.parametrize("reorder", [False, True])
def test_prefetch_yields_the_same_batches(tier, reorder):
    """Side-stream prefetch (the CUDA default) changes when a batch is made, not what it holds."""
    from mgg.runtime import world
    from mgg.graph import make_store
    from mgg.runtime.partition import partition_ranges
    from mgg.sample import StoreFeatures

    comm = world() if tier == "store" else None
    if tier == "store":
        pytest.importorskip("nvshmem.core")
    indptr, indices = random_csr(3000, 45000, seed=11)
    x = np.random.default_rng(5).standard_normal((3000, 40)).astype(np.float32)
    y = np.random.default_rng(6).integers(0, 7, 3000)
    store = make_store(comm, "gpu") if tier == "store" else None
    bounds = partition_ranges(indptr, comm.size) if comm is not None else None
    seeds = np.arange(0, 3000, 2)  # every rank's training nodes: each takes its share of every batch
    runs = {}
    for prefetch in (False, True):
        dev = DEV
        if tier == "host":
            src = HostTierFeatures(x, comm, device=DEV)
        elif tier == "store":
            src = StoreFeatures.from_global(store, bounds, x)
            dev = src.device  # the store's GPU (this rank's)
        else:
            src = x
        loader = NeighborLoader((indptr, indices), src, y, seeds, [6, 4], batch_size=200, device=dev,
                                reorder=reorder, seed=3, comm=comm, prefetch=prefetch)
        assert loader.prefetch is prefetch
        runs[prefetch] = [_batches(loader), _batches(loader)]  # two epochs
        assert loader.stats.gather_gpu_ms is not None and loader.stats.gather_gpu_ms > 0
        if tier != "tensor":
            src.close()
    assert len(runs[True][0]) == len(loader)
    for epoch_off, epoch_on in zip(runs[False], runs[True]):
        for (n0, x0, y0, b0), (n1, x1, y1, b1) in zip(epoch_off, epoch_on):
            assert np.array_equal(n0, n1) and np.array_equal(y0, y1)
            assert np.array_equal(x1, x[n1]), "a prefetched batch holds rows other than its ids'"
            assert np.array_equal(x0, x1)
            assert all(np.array_equal(p0, p1) and np.array_equal(c0, c1) for (p0, c0), (p1, c1) in zip(b0, b1))


def test_prefetch_thread_raises_in_the_caller_and_stops_on_break():
    import threading

    from mgg.sample import TensorFeatures

    class Failing(TensorFeatures):
        calls = 0

        def gather(self, n_id, checked=False):
            Failing.calls += 1
            if Failing.calls == 3:
                raise RuntimeError("gather failed on purpose")
            return super().gather(n_id, checked)

    indptr, indices = random_csr(2000, 20000, seed=12)
    x = np.random.default_rng(0).standard_normal((2000, 8)).astype(np.float32)
    y = np.zeros(2000, dtype=np.int64)
    alive = lambda: [t for t in threading.enumerate() if t.name == "mgg-loader-prefetch"]  # noqa: E731
    loader = NeighborLoader((indptr, indices), Failing(x, DEV), y, np.arange(2000), [3], batch_size=100,
                            device=DEV, reuse=False)
    assert loader.prefetch
    with pytest.raises(RuntimeError, match="on purpose"):
        for _ in loader:
            pass
    assert not alive()
    for i, batch in enumerate(loader):  # leaving early joins the thread
        if i == 1:
            break
    assert not alive()
    got = list(loader)  # and the next epoch is whole
    assert len(got) == len(loader) and all(np.array_equal(b.x.cpu().numpy(), x[b.n_id.cpu().numpy()]) for b in got)


@pytest.mark.parametrize("chunk", [None, 5000])
def test_overlap_matrix_on_gpu_equals_scipy(chunk):
    from mgg.sample import overlap_matrix_torch

    rng = np.random.default_rng(5)
    sets = [np.unique(rng.integers(0, 40000, rng.integers(0, 30000))) for _ in range(12)]
    ref = overlap_matrix(sets, 40000)  # host: scipy sparse product
    cuda_sets = [torch.from_numpy(s).cuda() for s in sets]
    got = overlap_matrix(cuda_sets, 40000) if chunk is None else \
        overlap_matrix_torch(cuda_sets, 40000, chunk_elems=chunk).cpu().numpy()
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("conv_name", ["gcn", "gat", "gat_dot"])
def test_block_convs_on_cuda_equal_the_cpu(conv_name):
    """GCNBlockConv / GATBlockConv run on CUDA tensors (torch ops): the outputs and input
    gradients of a real sampled block equal the CPU's (float64)."""
    from mgg.nn import GATBlockConv, GCNBlockConv
    from mgg.sample import sample_blocks

    indptr, indices = random_csr(500, 6000, seed=21)
    _, (block,) = sample_blocks(indptr, indices, torch.arange(0, 500, 7), [6], torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    conv = (GCNBlockConv(12, 5) if conv_name == "gcn" else
            GATBlockConv(12, 5, heads=3, attention="dot" if conv_name == "gat_dot" else "additive")).double()
    x = torch.randn(block.n_src, 12, dtype=torch.float64, requires_grad=True)
    out = conv(x, block)
    (gx,) = torch.autograd.grad(out.square().sum(), x)
    conv_d = conv.to(DEV)
    xd = x.detach().to(DEV).requires_grad_(True)
    out_d = conv_d(xd, block.to(DEV))
    (gxd,) = torch.autograd.grad(out_d.square().sum(), xd)
    assert out_d.is_cuda
    assert torch.allclose(out_d.cpu(), out, atol=1e-10) and torch.allclose(gxd.cpu(), gx, atol=1e-10)


def _hop_by_hop(indptr, indices, seeds, fanouts, gen, id_map):
    """The reference composition: sample_neighbors then the id map, hop by hop, exact-size tensors."""
    from mgg.sample import Block, unique_map

    nodes, blocks = seeds, []
    for f in fanouts:
        ptr, nbr = sample_neighbors(indptr, indices, nodes, f, gen)
        n_dst = int(nodes.numel())
        n_id, local = (fused_map if id_map == "fused" else unique_map)(torch.cat([nodes, nbr]), n_dst)
        blocks.append(Block(ptr, local[n_dst:], int(n_id.numel()), n_dst))
        nodes = n_id
    return nodes, blocks[::-1]


@pytest.mark.parametrize("fanouts", [[5, 3], [25, 10, 5], [-1, 4], [3, -1, 2], [40, 40]])
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("n_seeds", [0, 1, 300])
def test_sample_blocks_on_gpu_equal_the_hop_by_hop_path(fanouts, pinned, n_seeds):
    """sample_blocks on CUDA (one size read a hop, buffers sized on the device) makes exactly the
    batch of sampling then mapping hop by hop with the same generator (both id maps), and every
    Block's row is its ptr expanded."""
    from mgg.sample import sample_blocks

    indptr, indices = random_csr(4000, 70000, seed=len(fanouts) + n_seeds)
    ip = torch.from_numpy(indptr).to(DEV)
    ix = torch.from_numpy(indices).pin_memory() if pinned else torch.from_numpy(indices).to(DEV)
    seeds = torch.from_numpy(np.random.default_rng(n_seeds).choice(4000, n_seeds, replace=False)).to(DEV)
    n_id, blocks = sample_blocks(ip, ix, seeds, fanouts, torch.Generator().manual_seed(17))
    for id_map in ("fused", "unique"):
        ref_nid, ref_blocks = _hop_by_hop(ip, ix, seeds, fanouts, torch.Generator().manual_seed(17), id_map)
        assert torch.equal(n_id, ref_nid)
        for got, want in zip(blocks, ref_blocks):
            assert (got.n_src, got.n_dst) == (want.n_src, want.n_dst)
            assert torch.equal(got.ptr, want.ptr) and torch.equal(got.col, want.col)
    A = {(int(t), int(s)) for t in range(4000) for s in indices[indptr[t]:indptr[t + 1]]}
    nid = n_id.cpu().numpy()
    for blk in blocks:
        ptr = blk.ptr.cpu().numpy()
        assert np.array_equal(blk.row.cpu().numpy(), np.repeat(np.arange(blk.n_dst), np.diff(ptr)))
        for i, c in zip(blk.row.cpu().numpy(), blk.col.cpu().numpy()):
            assert (int(nid[i]), int(nid[c])) in A
    assert blocks[-1].n_dst == n_seeds and blocks[0].n_src == len(nid) == len(np.unique(nid))


def _synchronisations(fn) -> int:
    """How many synchronising CUDA calls torch reports while fn() runs."""
    import warnings

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("fanouts,reads", [([30, 30, 30], 1), ([10, 5], 1), ([-1, 5], 3)])
def test_gpu_sampling_reads_sizes_once_per_batch(fanouts, reads):
    """Fanouts >= 1: one device-to-host read a batch (every hop's sizes at once); with a fanout of
    -1, one a hop plus the first hop's edge count. Block.row, made where it is used, does not
    synchronise either (its size is the block's edge count)."""
    from mgg.sample import sample_blocks

    indptr, indices = random_csr(5000, 80000, seed=3)
    ip, ix = torch.from_numpy(indptr).to(DEV), torch.from_numpy(indices).to(DEV)
    seeds = torch.arange(0, 5000, 9, device=DEV)
    sample_blocks(ip, ix, seeds, fanouts, torch.Generator().manual_seed(0))  # loads the kernels
    torch.cuda.synchronize()
    out = {}
    assert _synchronisations(lambda: out.update(b=sample_blocks(ip, ix, seeds, fanouts,
                                                                torch.Generator().manual_seed(1)))) == reads
    assert _synchronisations(lambda: [blk.row for blk in out["b"][1]]) == 0


def test_loader_batch_synchronises_a_few_times_only():
    """A whole batch of the loader (no prefetch): one read of the sampled sizes, one range check of
    the ids by the feature source, one count of the rows the resident cache misses."""
    indptr, indices = random_csr(3000, 45000, seed=8)
    x = np.random.default_rng(0).standard_normal((3000, 16)).astype(np.float32)
    loader = NeighborLoader((indptr, indices), x, np.zeros(3000, np.int64), np.arange(3000), [10, 5],
                            batch_size=300, device=DEV, prefetch=False, shuffle=False)
    list(loader)  # loads the kernels
    it = iter(loader)
    next(it)
    torch.cuda.synchronize()
    for _ in range(3):
        batch = {}
        assert _synchronisations(lambda: batch.update(b=next(it))) <= 3
        assert batch["b"].rows_reused > 0  # the cached gather ran (hits and misses)


@pytest.mark.parametrize("fanout", [1, 5, 32, 33, 60, -1])
@pytest.mark.parametrize("pinned", [False, True])
def test_sample_kernel_follows_its_random_stream_exactly(fanout, pinned):
    """sample_uniform's output for a kernel seed is the Python spec's, bit for bit, for k up to
    FLOYD_SHARED_K (positions in shared memory) and above it (positions in the output row)."""
    from mgg.testing.sample_reference import floyd_sample_reference

    indptr, indices = random_csr(600, 40000, seed=13)  # mean degree ~67: rows above and below every fanout
    seeds = np.random.default_rng(1).choice(600, 250, replace=False)
    ip, ix = torch.from_numpy(indptr), torch.from_numpy(indices)
    ip, ix = (ip.pin_memory(), ix.pin_memory()) if pinned else (ip.to(DEV), ix.to(DEV))
    ptr, nbr = sample_neighbors_cuda(ip, ix, torch.from_numpy(seeds).to(DEV), fanout, seed=2 ** 61 + 12345)
    want_ptr, want_nbr = floyd_sample_reference(indptr, indices, seeds, fanout, 2 ** 61 + 12345)
    assert np.array_equal(ptr.cpu().numpy(), want_ptr) and np.array_equal(nbr.cpu().numpy(), want_nbr)
