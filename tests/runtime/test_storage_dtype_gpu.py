"""16-bit storage (--storage-dtype bf16 / fp16) on the GPU against a float64 oracle.

The oracle runs on the inputs rounded to the storage dtype first (torch's round to nearest
even, what `SymmetricArray.write` and the launchers do), so a correct kernel -- 16-bit loads,
float32 sums -- matches it to float32 accumulation error (1e-5 relative); it must also sit
visibly away from the oracle on the unrounded inputs, which proves the kernel read 16-bit rows.
Outputs, partials and halo buffers are NaN-poisoned before every launch.

* CsrRowsExecutor (mgg/kernels/local_csr.cu, mgg_csr_rows_{bf16,fp16}_*): CUDA and cupy only.
* DistGraph on the GPU backend (NvshmemStore arrays in bf16/fp16, variant auto -> csr_rows at
  P = 1 / halo with mgg_halo_gather + mgg_local_{bf16,fp16}_v* at P > 1), forward, transposed and
  autograd: needs nvshmem4py; alone (P = 1) and under
  `mpirun -np 2 python -m pytest --with-mpi tests/runtime/test_storage_dtype_gpu.py` (P = 2).
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.csr_rows import CsrRowsExecutor  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig  # noqa: E402
from mgg.runtime.store import storage_torch_dtype  # noqa: E402
from mgg.testing.reference import aggregate_reference  # noqa: E402
from mgg.testing.graphs import random_csr  # noqa: E402
from mgg.testing.dist_graphs import cpu_plans  # noqa: E402
from mgg.testing.graphs import hub_graph  # noqa: E402  (the power-law graph of the csr_rows tests)

SIXTEEN = ("bf16", "fp16")
ACC_TOL = 1e-5
ROUNDING_FLOOR = {"bf16": 3e-4, "fp16": 4e-5}  # as tests/runtime/test_storage_dtype.py
#: every lane layout of the 16-bit kernels: 8 elements per 16-byte vector, up to 32 x 4 vectors
DIMS = (1, 5, 8, 16, 33, 64, 130, 256, 512, 1000, 1024)


def rel_err(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def rounded(x: np.ndarray, name: str) -> np.ndarray:
    return torch.from_numpy(x).to(storage_torch_dtype(name)).double().numpy()


@pytest.mark.parametrize("name", SIXTEEN)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("chunk", [2048, 64])  # 64: hub rows split over warps (combine kernel)
def test_csr_rows_16_bit_matches_oracle_on_rounded_inputs(name, dim, kind, chunk):
    indptr, indices = hub_graph()
    x = np.random.default_rng(dim).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    for transposed, plan in cpu_plans(indptr, indices, kind).items():
        for weighted in (False, True):  # factored weights, then the per-edge weight array
            ex = CsrRowsExecutor(plan, None, None if weighted else kind, chunk=chunk,
                                 storage_dtype=storage_torch_dtype(name))
            ex.poison = True
            # column kinds (gcn; mean transposed) read the plan's per-edge weights in 16 bits
            assert ex.column_by_weights == (ex.factors.mode == "column") and not ex.can_prescale
            out = ex(torch.from_numpy(x).cuda()).cpu().numpy()
            assert out.shape == x.shape and out.dtype == np.float32
            assert not np.isnan(out).any()
            ref = aggregate_reference(indptr, indices, rounded(x, name), kind, transposed)
            assert rel_err(out, ref) < ACC_TOL, (transposed, weighted)
            ref32 = aggregate_reference(indptr, indices, x, kind, transposed)
            assert rel_err(out, ref32) > ROUNDING_FLOOR[name]


@pytest.mark.parametrize("name", SIXTEEN)
@pytest.mark.parametrize("dim", (1, 5, 8, 16, 24, 32))  # the scan kernel's 2, 4 and 8 lanes of 4 columns
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("run", [1024, 7])  # entries a scan run aims at: one window, or windows of many rows
def test_scan_16_bit_matches_oracle_on_rounded_inputs(name, dim, kind, segments, run):
    """The scan mapping (mgg_csr_scan_{bf16,fp16}_*: a lane a quad of 4 16-bit columns) forced on
    every 16-bit width it takes, forward and transposed, factored weights and the per-edge weight
    array, hub rows split over warps (chunk 500), in one and three source segments."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(dim).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    ref_in = rounded(x, name)
    for transposed, plan in cpu_plans(indptr, indices, kind).items():
        ref = aggregate_reference(indptr, indices, ref_in, kind, transposed)
        for weighted in (False, True):
            ex = CsrRowsExecutor(plan, None, None if weighted else kind, chunk=500, row_mapping="scan",
                                 source_segments=segments, scan_run=run, storage_dtype=storage_torch_dtype(name))
            assert ex.short_mapping(*ex._layout(dim)[2:]) == "scan"
            ex.poison = True
            for _ in range(2):  # twice: the second call on cached schedules and segments
                out = ex(torch.from_numpy(x).cuda()).cpu().numpy()
                assert out.shape == x.shape and not np.isnan(out).any()
                assert rel_err(out, ref) < ACC_TOL, (transposed, weighted)
            assert rel_err(out, aggregate_reference(indptr, indices, x, kind, transposed)) > ROUNDING_FLOOR[name]


def test_csr_rows_16_bit_width_limit():
    indptr, indices = hub_graph()
    plan = cpu_plans(indptr, indices, "sum")[False]
    ex = CsrRowsExecutor(plan, None, "sum", storage_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="limit of 1024"):
        ex(torch.zeros((plan.n_local, 1025), device="cuda"))


# -- the whole GPU path: NVSHMEM store, variant choice, autograd ---------------------------------
def _world():
    pytest.importorskip("nvshmem.core")
    from mgg.runtime import world

    return world()


@pytest.mark.parametrize("name", SIXTEEN)
@pytest.mark.parametrize("variant", ["auto", "halo"])
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("dim", [3, 16, 64, 200])
def test_distgraph_16_bit_matches_oracle(name, variant, kind, dim):
    comm = _world()
    indptr, indices = random_csr(700, 9000, seed=11)
    x = np.random.default_rng(dim).standard_normal((700, dim)).astype(np.float32)
    cfg = RuntimeConfig(ps=4, dist=2, wpb=4, backend="gpu", variant=variant, storage_dtype=name)
    with DistGraph(indptr, indices, comm, cfg) as dg:
        for transposed in (False, True):
            ex = dg.executor(kind, transposed)
            ex.poison = True
            xl = torch.from_numpy(dg.local(x).copy()).cuda()
            outs = [dg.aggregate(xl, kind, transposed).cpu().numpy() for _ in range(2)]  # buffers reused
            assert dg.symmetric(dim, storage_torch_dtype(name)).dtype == storage_torch_dtype(name)
            ref = aggregate_reference(indptr, indices, rounded(x, name), kind, transposed)[dg.lo:dg.hi]
            ref32 = aggregate_reference(indptr, indices, x, kind, transposed)[dg.lo:dg.hi]
            for out in outs:
                assert not np.isnan(out).any()
                assert rel_err(out, ref) < ACC_TOL
                assert rel_err(out, ref32) > ROUNDING_FLOOR[name]
            if comm.size > 1:
                assert dg.plan(kind, transposed).num_remote_edges > 0


@pytest.mark.parametrize("name", SIXTEEN)
def test_gpu_16_bit_autograd_matches_cpu(name):
    from mgg.testing.dist_graphs import gcn_on_cpu_and_gpu

    comm = _world()
    indptr, indices = random_csr(500, 7000, seed=3)
    x = np.random.default_rng(9).standard_normal((500, 24)).astype(np.float32)
    g = np.random.default_rng(10).standard_normal((500, 24)).astype(np.float32)
    res, lo, hi = gcn_on_cpu_and_gpu(comm, indptr, indices, x, g, storage_dtype=name)
    ref_f = aggregate_reference(indptr, indices, rounded(x, name), "gcn")[lo:hi]
    ref_b = aggregate_reference(indptr, indices, rounded(g, name), "gcn", transposed=True)[lo:hi]
    for backend in ("cpu", "gpu"):
        assert rel_err(res[backend][0], ref_f) < ACC_TOL
        assert rel_err(res[backend][1], ref_b) < ACC_TOL  # gradient rows stored in 16 bits too
    assert rel_err(res["gpu"][0], res["cpu"][0]) < ACC_TOL


@pytest.mark.parametrize("variant", ["pipelined", "ptr", "nonpipelined", "paper", "pipelined_2pass"])
def test_fp32_only_variants_refuse_16_bit_storage(variant):
    comm = _world()
    indptr, indices = random_csr(200, 2000, seed=1)
    cfg = RuntimeConfig(backend="gpu", variant=variant, storage_dtype="bf16")
    with DistGraph(indptr, indices, comm, cfg) as dg:
        with pytest.raises(ValueError, match=f"not implemented for GPU --variant {variant}"):
            dg.executor("gcn")


def test_16_bit_store_rows_round_trip():
    from mgg.graph import make_store

    comm = _world()
    store = make_store(comm, "gpu")
    for name in SIXTEEN:
        dt = storage_torch_dtype(name)
        arr = store.allocate(6, 5, dt)
        assert arr.dim_padded == 8 and arr.vecs == 1 and arr.padded.dtype == dt
        base = torch.arange(6, dtype=torch.float32, device="cuda").unsqueeze(1).repeat(1, 5) / 3
        arr.write(base + 100 * comm.rank)
        arr.publish()
        for pe in range(comm.size):
            got = arr.get_rows(pe, np.array([5, 0, 3])).cpu()
            want = (torch.tensor([5.0, 0.0, 3.0]).unsqueeze(1).repeat(1, 5) / 3 + 100 * pe).to(dt)
            assert got.dtype == dt and torch.equal(got, want)
        arr.release()
        arr.free()
