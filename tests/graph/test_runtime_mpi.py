"""Multi-rank runtime tests: run with `mpirun -np 2|3 python -m pytest --with-mpi
tests/graph/test_runtime_mpi.py`."""
import numpy as np
import pytest
import torch

from mgg.testing.reference import aggregate_reference
from mgg.runtime import MPIStore, world
from mgg.graph import SCALED_INPUT, DistGraph, GcnFactors, RuntimeConfig
from mgg.testing.graphs import random_csr

pytestmark = pytest.mark.mpi(min_size=2)


def rel_err(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("n,e,ps,dist,wpb", [(400, 4000, 4, 2, 2), (257, 900, 1, 1, 1), (120, 6000, 32, 8, 4)])
def test_distributed_aggregation_matches_reference(kind, transposed, n, e, ps, dist, wpb):
    comm = world()
    indptr, indices = random_csr(n, e, seed=n + e)
    x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(ps, dist, wpb, backend="cpu")) as dg:
        assert dg.store.name == "mpi"
        out = dg.aggregate(torch.from_numpy(dg.local(x).copy()), kind, transposed).numpy()
        if comm.size > 1 and e > 1000:
            assert dg.plan(kind, transposed).num_remote_edges > 0  # the remote path really ran
    ref = dg.local(aggregate_reference(indptr, indices, x, kind, transposed))
    assert rel_err(out, ref) < 1e-5


def test_more_ranks_than_nodes():
    comm = world()
    indptr, indices = np.array([0, 1, 2]), np.array([1, 0])  # 2 nodes, 2 edges
    x = np.array([[1.0], [2.0]], dtype=np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="cpu")) as dg:
        out = dg.aggregate(torch.from_numpy(dg.local(x).copy()), "sum").numpy()
    assert np.allclose(out, dg.local(x[::-1]))


def test_store_one_sided_get():
    comm = world()
    store = MPIStore(comm)
    arr = store.allocate(5, 3)
    arr.write(torch.full((5, 3), float(comm.rank)) + torch.arange(5.0).unsqueeze(1))
    arr.publish()
    for pe in range(comm.size):
        rows = np.array([4, 0, 2])
        got = arr.get_rows(pe, rows)
        assert torch.equal(got, torch.full((3, 3), float(pe)) + torch.tensor(rows, dtype=torch.float32).unsqueeze(1))
    with pytest.raises(IndexError):
        arr.get_rows(0, np.array([5]))
    arr.release()
    arr.free()


def test_all_kinds_from_one_graph_share_structure():
    """Plans after the first of a direction are re-weighted copies: they must still be exact."""
    comm = world()
    indptr, indices = random_csr(300, 3000, seed=77)
    x = np.random.default_rng(1).standard_normal((300, 3)).astype(np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(5, 2, 2, backend="cpu")) as dg:
        for transposed in (True, False):
            for kind in ("gcn", "sum", "mean"):
                out = dg.aggregate(torch.from_numpy(dg.local(x).copy()), kind, transposed).numpy()
                ref = dg.local(aggregate_reference(indptr, indices, x, kind, transposed))
                assert rel_err(out, ref) < 1e-5, (kind, transposed)


@pytest.mark.parametrize("kind", ["sum", "gcn"])
def test_row_set_aggregation_matches_reference(kind):
    """W_S and W_S^T over P ranks (rank 1 holds no row of S) against float64 scipy."""
    from mgg.testing.reference import aggregation_matrix

    comm = world()
    n = 400
    indptr, indices = random_csr(n, 5000, seed=12)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(4, 2, 2, backend="cpu")) as dg:
        bounds = dg.bounds
        chosen = np.sort(rng.choice(n, 60, replace=False))
        chosen = chosen[(chosen < bounds[1]) | (chosen >= bounds[2])]  # none on rank 1
        mine = chosen[(chosen >= dg.lo) & (chosen < dg.hi)] - dg.lo
        rs = dg.register_rows("s", mine)
        assert rs.num_global == len(chosen)
        g = np.zeros((n, 4), np.float32)
        g[chosen] = rng.standard_normal((len(chosen), 4))
        out = dg.aggregate(torch.from_numpy(dg.local(x).copy()), kind, rows=rs)[rs.index].numpy()
        back = dg.aggregate(torch.from_numpy(dg.local(g).copy()), kind, transposed=True, rows=rs).numpy()
    ws = aggregation_matrix(indptr, indices, kind)[chosen]
    want = (ws @ x.astype(np.float64))[(chosen >= dg.lo) & (chosen < dg.hi)]
    assert rel_err(out, want) < 1e-5 if len(want) else out.shape[0] == 0
    assert rel_err(back, dg.local(ws.T @ g[chosen].astype(np.float64))) < 1e-5


def test_expand_rows_over_ranks_adds_remote_in_neighbours():
    comm = world()
    n = 300
    indptr, indices = random_csr(n, 2000, seed=13)
    chosen = np.sort(np.random.default_rng(4).choice(n, 25, replace=False))
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="cpu")) as dg:
        mine = chosen[(chosen >= dg.lo) & (chosen < dg.hi)] - dg.lo
        wide = dg.expand_rows(dg.register_rows("s", mine), "s.0")
        got = (wide.index.numpy() + dg.lo).tolist()
        lo, hi = dg.lo, dg.hi
    want = set(chosen.tolist())
    for r in chosen:
        want |= set(indices[indptr[r]:indptr[r + 1]].tolist())
    assert got == sorted(v for v in want if lo <= v < hi)
    assert wide.num_global == len(want)


@pytest.mark.parametrize("transposed", [False, True])
def test_gcn_scaled_input_and_no_row_factor_over_ranks(transposed):
    """The CPU executor takes no scaled table natively: DistGraph.aggregate(factors=SCALED_INPUT) /
    (factors=GcnFactors(row=False)) divide by the gcn factor around the plain call, and still give
    diag(f) (A + I) x / (A + I)^T diag(f) g on every rank (the GPU's native path over ranks:
    tests/kernels/test_halo_csr_gpu.py)."""
    comm = world()
    n, e = 300, 3000
    indptr, indices = random_csr(n, e, seed=11)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    dinv = (1.0 / np.sqrt(np.diff(indptr).astype(np.float64) + 1.0))
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="cpu")) as dg:
        assert not dg.takes_scaled_input("gcn")
        f = dg.gcn_factor()
        assert np.allclose(f.numpy(), dg.local(dinv), rtol=1e-7, atol=0)
        xl = torch.from_numpy(dg.local(x).copy())
        if transposed:  # (A + I)^T diag(f) g = W^T g / f
            out = dg.aggregate(xl, "gcn", True, factors=GcnFactors(row=False)).numpy()
            ref = dg.local(aggregate_reference(indptr, indices, x, "gcn", True)) / dg.local(dinv)[:, None]
        else:  # the aggregation of the unscaled rows, given f * x
            out = dg.aggregate(xl * f.unsqueeze(1), "gcn", factors=SCALED_INPUT).numpy()
            ref = dg.local(aggregate_reference(indptr, indices, x, "gcn"))
    assert rel_err(out, ref) < 1e-5


def test_scaled_input_is_native_on_every_rank_or_none():
    """A rank's symmetric slice is read by the others, so a partial gcn call runs natively only
    where every rank's executor takes it: here rank 0's claims it and the others' do not, so all
    fall back (rank 0 alone would call its executor with flags it has not got), and the answer
    is right on every rank."""
    comm = world()
    n, e = 300, 3000
    indptr, indices = random_csr(n, e, seed=12)
    x = np.random.default_rng(6).standard_normal((n, 4)).astype(np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="cpu")) as dg:
        if comm.rank == 0:
            for t in (False, True):
                dg.executor("gcn", t).takes_scaled_input = True
        assert not dg.takes_scaled_input("gcn")
        f = dg.gcn_factor()
        xl = torch.from_numpy(dg.local(x).copy())
        out = dg.aggregate(xl * f.unsqueeze(1), "gcn", factors=SCALED_INPUT).numpy()
    assert rel_err(out, dg.local(aggregate_reference(indptr, indices, x, "gcn"))) < 1e-5
