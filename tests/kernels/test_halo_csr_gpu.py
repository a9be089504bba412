"""HaloCsrExecutor (mgg/kernels/halo_csr.py: mgg_halo_gather_rows + two mgg_csr_rows passes)
against the float64 reference, on a power-law graph with hub rows split over several warps.

Runs at P = 1 (no remote work: the local pass alone) and under `mpirun -np 2 python -m pytest
--with-mpi tests/kernels/test_halo_csr_gpu.py` (P = 2: the fused pass over [own | halo] rows; the
two passes: the gather beside the local pass, then the remote pass adding to the rows). Every output, partial and halo buffer is NaN-poisoned. Needs CUDA,
cupy and nvshmem4py.
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

from mgg.kernels.halo_csr import HaloCsrExecutor  # noqa: E402
from mgg.testing.reference import aggregate_reference, aggregation_matrix  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import SCALED_INPUT, DistGraph, GcnFactors, RuntimeConfig  # noqa: E402
from mgg.testing.graphs import hub_graph  # noqa: E402  (the power-law graph with hubs of the csr_rows tests)
from mgg.testing.tensors import rel_err  # noqa: E402


@pytest.mark.parametrize("dim", [1, 16, 33, 64, 512])
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("transposed", [False, True])
def test_matches_reference(kind, dim, transposed):
    indptr, indices = hub_graph()
    x = np.random.default_rng(dim).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    ref = aggregate_reference(indptr, indices, x, kind, transposed)
    with DistGraph(indptr, indices, world(), RuntimeConfig(backend="gpu", variant="halo_csr")) as dg:
        plan = dg.plan(kind, transposed)
        xl = torch.from_numpy(dg.local(x).copy()).cuda()
        # fused (one pass over [own | halo] rows), then the two passes with and without overlap
        for chunk, fused, overlap in ((2048, True, True), (300, True, True), (2048, False, True),
                                      (300, False, True), (300, False, False)):  # 300: hubs split over warps
            ex = HaloCsrExecutor(plan, dg.store, kind, chunk=chunk)
            ex.poison, ex.fused, ex.overlap = True, fused, overlap
            # the rows' pass in its default mapping, then in runs of rows (mgg_csr_scan where the
            # width has a scan kernel, else the default's kernels)
            for mapping in ("default", "scan"):
                ex.rows.retune(row_mapping=mapping)
                for _ in range(2):  # buffers and schedules reused
                    out = ex(xl, dg.symmetric(dim)).cpu().numpy()
                    assert not np.isnan(out).any()
                    assert rel_err(out, ref[dg.lo: dg.hi]) < 1e-5, (chunk, fused, overlap, mapping)
            if world().size > 1:
                assert plan.num_remote_edges > 0
                want = {"sum": "one", "sum_self": "one", "mean": "column" if transposed else "one",
                        "gcn": "column"}[kind]
                assert ex.factors.mode == want and ex.rows.factors.mode == want
                assert ex.prescale == (want == "column")
                assert (ex.rows is ex.local) != fused


def test_halves_and_the_wide_fallback():
    """only="local" + only="remote" = the whole; a 600-wide float32 row (above the row kernels'
    512) goes to the halo partition kernels and still matches."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(3).standard_normal((len(indptr) - 1, 600)).astype(np.float32)
    ref = aggregate_reference(indptr, indices, x, "gcn")
    with DistGraph(indptr, indices, world(), RuntimeConfig(backend="gpu", variant="halo_csr")) as dg:
        ex = dg.executor("gcn")
        assert isinstance(ex, HaloCsrExecutor)
        if world().size > 1:  # 40-wide rows (10 vectors) and a halo of a few hundred rows: two passes
            assert ex.fused is None and not ex.uses_fused(40)
            ex.fused = True
            assert ex.uses_fused(40)
        ex.poison = True
        xl = torch.from_numpy(dg.local(x[:, :40]).copy()).cuda()
        whole = ex(xl, dg.symmetric(40)).cpu().numpy()
        loc, rem = (ex(xl, dg.symmetric(40), only=o).cpu().numpy() for o in ("local", "remote"))
        r40 = aggregate_reference(indptr, indices, x[:, :40], "gcn")[dg.lo: dg.hi]
        assert rel_err(whole, r40) < 1e-5 and rel_err(loc + rem, r40) < 1e-5
        if world().size > 1:
            assert np.abs(rem).sum() > 0
        wide = torch.from_numpy(dg.local(x).copy()).cuda()
        out = dg.aggregate(wide, "gcn").cpu().numpy()
        assert rel_err(out, ref[dg.lo: dg.hi]) < 1e-5


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16bit_storage(dtype, fused):
    """16-bit rows gathered unchanged, float32 sums: the reference of the rounded table."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(4).standard_normal((len(indptr) - 1, 24)).astype(np.float32)
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    xr = torch.from_numpy(x).to(tdt).float().numpy()
    with DistGraph(indptr, indices, world(), RuntimeConfig(backend="gpu", variant="halo_csr",
                                                           storage_dtype=dtype)) as dg:
        for kind in ("sum", "gcn"):
            ex = dg.executor(kind)
            ex.poison, ex.fused = True, fused
            out = dg.aggregate(torch.from_numpy(dg.local(x).copy()).cuda(), kind).cpu().numpy()
            ref = aggregate_reference(indptr, indices, xr, kind)[dg.lo: dg.hi]
            assert not np.isnan(out).any() and rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("dim", [16, 33])
def test_scaled_input_natively_over_ranks(dtype, dim, fused):
    """gcn on a table its producer scaled by the column factor, at any P: every rank's slice
    holds f * x (rounded once in bf16), the gather copies rows unchanged and both passes run
    w = 1. SCALED_INPUT: W x; GcnFactors(row=False) (transposed): (A + I)^T diag(f) g; both from an
    unscaled x (the executor scales it once, into the slice). Against float64 dense math on the
    rows as stored; every buffer NaN-poisoned."""
    indptr, indices = hub_graph()
    n = len(indptr) - 1
    d = 1.0 / np.sqrt(np.diff(indptr).astype(np.float64) + 1.0)
    w = aggregation_matrix(indptr, indices, "gcn")  # W + diag, float64 sparse
    a_hat = w.multiply(1.0 / d[:, None]).multiply(1.0 / d[None, :]).tocsr()  # A + I
    rng = np.random.default_rng(dim)
    x, g = rng.standard_normal((n, dim)), rng.standard_normal((n, dim))
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float32

    def stored(t: np.ndarray) -> np.ndarray:  # f * t as the slice holds it: float32, then rounded
        return torch.from_numpy(t).float().to(tdt).double().numpy()

    with DistGraph(indptr, indices, world(), RuntimeConfig(backend="gpu", variant="halo_csr",
                                                           storage_dtype=dtype)) as dg:
        assert dg.takes_scaled_input("gcn")
        for t in (False, True):
            ex = dg.executor("gcn", t)
            assert isinstance(ex, HaloCsrExecutor) and ex.takes_scaled_input
            ex.poison, ex.fused = True, fused
        if world().size > 1:
            assert dg.plan("gcn").num_remote_edges > 0
        f = dg.gcn_factor()
        xs = (f.unsqueeze(1) * torch.from_numpy(dg.local(x).copy()).float().cuda()).contiguous()
        xs_all = np.zeros((n, dim))
        xs_all[dg.lo: dg.hi] = xs.double().cpu().numpy()
        world().allreduce_(xs_all)  # every rank's scaled rows
        out = dg.aggregate(xs, "gcn", factors=SCALED_INPUT).double().cpu().numpy()
        ref = (d[:, None] * (a_hat @ stored(xs_all)))[dg.lo: dg.hi]
        assert not np.isnan(out).any() and rel_err(out, ref) < 1e-5
        gl = torch.from_numpy(dg.local(g).copy()).float().cuda()
        out = dg.aggregate(gl, "gcn", transposed=True, factors=GcnFactors(row=False)).double().cpu().numpy()
        fg = np.zeros((n, dim))
        fg[dg.lo: dg.hi] = (f.unsqueeze(1) * gl).double().cpu().numpy()
        world().allreduce_(fg)
        ref = (a_hat.T @ stored(fg))[dg.lo: dg.hi]
        assert not np.isnan(out).any() and rel_err(out, ref) < 1e-5
        # the plain call still agrees (the gather scales the halo in float32; bf16: weights per edge)
        out = dg.aggregate(torch.from_numpy(dg.local(x).copy()).float().cuda(), "gcn").double().cpu().numpy()
        ref = (w @ stored(x))[dg.lo: dg.hi]
        assert rel_err(out, ref) < 1e-5
