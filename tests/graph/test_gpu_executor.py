"""GPU executor vs the CPU executor and the float64 reference.

Runs on a machine with CUDA, cupy and nvshmem4py: alone (P = 1) and under `mpirun -np 2 python -m
pytest --with-mpi tests/graph/test_gpu_executor.py` (P = 2; any P works). Skipped elsewhere. Every
output / partial / halo buffer is NaN-poisoned before each launch.
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

from mgg.kernels.variants import get_variant, variant_names  # noqa: E402
from mgg.testing.reference import aggregate_reference  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig  # noqa: E402
from mgg.testing.dist_graphs import gcn_on_cpu_and_gpu  # noqa: E402
from mgg.testing.graphs import random_csr  # noqa: E402
from mgg.testing.tensors import rel_err  # noqa: E402


def _run(indptr, indices, x, kind, transposed, variant, ps, dist, wpb):
    comm = world()
    cfg = RuntimeConfig(ps=ps, dist=dist, wpb=wpb, backend="gpu", variant=variant)
    with DistGraph(indptr, indices, comm, cfg) as dg:
        ex = dg.executor(kind, transposed)
        ex.poison = True
        xl = torch.from_numpy(dg.local(x).copy()).cuda()
        outs = [dg.aggregate(xl, kind, transposed).cpu().numpy() for _ in range(2)]  # buffers reused
        lo, hi = dg.lo, dg.hi
        remote = dg.plan(kind, transposed).num_remote_edges
    return outs, lo, hi, remote


@pytest.mark.parametrize("variant", variant_names() + ("auto",))
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("transposed", [False, True])
def test_variants_match_reference(variant, kind, transposed):
    if variant != "auto" and get_variant(variant).local_only and world().size > 1:
        pytest.skip(f"{variant} aggregates ranks without remote work only")
    indptr, indices = random_csr(700, 9000, seed=11)
    x = np.random.default_rng(5).standard_normal((700, 16)).astype(np.float32)
    outs, lo, hi, remote = _run(indptr, indices, x, kind, transposed, variant, 4, 2, 4)
    ref = aggregate_reference(indptr, indices, x, kind, transposed)[lo:hi]
    if world().size > 1:
        assert remote > 0
    for out in outs:
        assert not np.isnan(out).any()
        assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("variant", ["pipelined", "ptr", "halo", "halo_overlap", "halo_csr", "paper_nbi",
                                     "pipelined_2pass"])
@pytest.mark.parametrize("dim,ps,dist,wpb", [(1, 1, 1, 1), (7, 3, 5, 2), (64, 32, 16, 8), (130, 16, 4, 16),
                                             (512, 8, 2, 4)])
def test_widths_and_params(variant, dim, ps, dist, wpb):
    indptr, indices = random_csr(400, 6000, seed=dim + ps)
    x = np.random.default_rng(dim).standard_normal((400, dim)).astype(np.float32)
    outs, lo, hi, _ = _run(indptr, indices, x, "gcn", False, variant, ps, dist, wpb)
    ref = aggregate_reference(indptr, indices, x, "gcn")[lo:hi]
    assert rel_err(outs[0], ref) < 1e-5


def test_gpu_matches_cpu_executor_and_autograd():
    comm = world()
    indptr, indices = random_csr(500, 7000, seed=3)
    x = np.random.default_rng(9).standard_normal((500, 24)).astype(np.float32)
    g = np.random.default_rng(10).standard_normal((500, 24)).astype(np.float32)
    res, lo, hi = gcn_on_cpu_and_gpu(comm, indptr, indices, x, g)
    ref_out = aggregate_reference(indptr, indices, x, "gcn")[lo:hi]
    ref_grad = aggregate_reference(indptr, indices, g, "gcn", transposed=True)[lo:hi]
    for backend, (out, grad) in res.items():
        assert rel_err(out, ref_out) < 1e-5, backend
        assert rel_err(grad, ref_grad) < 1e-5, backend
    assert rel_err(res["gpu"][0], res["cpu"][0]) < 1e-5


def test_symmetric_store_get_rows():
    from mgg.graph import make_store

    comm = world()
    store = make_store(comm, "gpu")
    arr = store.allocate(6, 5)
    base = torch.arange(6, dtype=torch.float32, device="cuda").unsqueeze(1).repeat(1, 5)
    arr.write(base + 100 * comm.rank)
    arr.publish()
    for pe in range(comm.size):
        got = arr.get_rows(pe, np.array([5, 0, 3])).cpu()
        want = torch.tensor([5.0, 0.0, 3.0]).unsqueeze(1).repeat(1, 5) + 100 * pe
        assert torch.equal(got, want)
    arr.release()
    arr.free()


@pytest.mark.parametrize("variant", ["halo", "halo_overlap"])
def test_halves_add_up_to_the_whole(variant):
    """only="local" + only="remote" (bench/overlap.py's halves) = the whole aggregation (sum: no
    self term), and a non-halo variant refuses `only`."""
    comm = world()
    indptr, indices = random_csr(600, 9000, seed=11)
    x = np.random.default_rng(12).standard_normal((600, 40)).astype(np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu", variant=variant)) as dg:
        ex = dg.executor("sum")
        ex.poison = True
        xl = torch.from_numpy(dg.local(x).copy()).cuda()
        sym = dg.symmetric(40)
        whole = ex(xl, sym).cpu().numpy()
        loc, rem = (ex(xl, sym, only=o).cpu().numpy() for o in ("local", "remote"))
        ref = aggregate_reference(indptr, indices, x, "sum")[dg.lo: dg.hi]
    assert rel_err(whole, ref) < 1e-5 and rel_err(loc + rem, ref) < 1e-5
    if comm.size > 1:
        assert np.abs(rem).sum() > 0
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu", variant="ptr")) as dg:
        with pytest.raises(ValueError, match="halo variants"):
            dg.executor("sum")(torch.zeros(dg.n_local, 4, device="cuda"), dg.symmetric(4), only="local")
