"""Memory-mapped graphs across ranks: the exchange-built transposed rows and every plan equal the
in-memory build's; alltoallv moves blocks in rank order; per-rank validation agrees on errors.
Run with `mpirun -np 1|2|3 python -m pytest --with-mpi tests/runtime/test_mapped_mpi.py`."""
import dataclasses

import numpy as np
import pytest

from mgg.data import Graph, save_npz
from mgg.data.npz import load_npz
from mgg.runtime import world
from mgg.graph import DistGraph, RuntimeConfig
from mgg.runtime.transpose import transposed_rows
from mgg.testing.graphs import random_csr

pytestmark = pytest.mark.mpi(min_size=1)

_PLAN_ARRAYS = [f.name for f in dataclasses.fields(__import__("mgg.runtime.plan", fromlist=["AggregationPlan"]).AggregationPlan)]


def _saved(tmp_path, n, e, seed):
    indptr, indices = random_csr(n, e, seed=seed)  # duplicates, self loops, unsorted rows
    path = tmp_path / f"g{world().rank}.npz"
    save_npz(Graph(indptr, indices), path)
    return indptr, indices, load_npz(path, mmap=True)


def test_alltoallv_blocks_in_rank_order():
    comm = world()
    p, r = comm.size, comm.rank
    counts = np.array([(r + q) % 3 for q in range(p)], dtype=np.int64)
    send = np.concatenate([np.full(c, 100 * r + q, dtype=np.int64) for q, c in enumerate(counts)] or [np.zeros(0, np.int64)])
    recv, rc = comm.alltoallv(send, counts)
    expect = np.concatenate([np.full((q + r) % 3, 100 * q + r, dtype=np.int64) for q in range(p)])
    assert np.array_equal(rc, [(q + r) % 3 for q in range(p)])
    assert np.array_equal(recv, expect)


@pytest.mark.parametrize("n,e,seed", [(300, 3000, 1), (97, 50, 2), (40, 2000, 3)])
@pytest.mark.parametrize("kind", ["gcn", "mean"])
def test_mapped_plans_equal_in_memory(tmp_path, n, e, seed, kind):
    comm = world()
    indptr, indices, mapped = _saved(tmp_path, n, e, seed)
    assert isinstance(mapped.indices, np.memmap)
    cfg = RuntimeConfig(ps=4, dist=2, wpb=2, backend="cpu")
    with DistGraph(indptr, indices, comm, cfg) as ref, DistGraph.build(mapped, comm, RuntimeConfig(**cfg.to_dict())) as dg:
        # one rank reads every row anyway, so it scans
        assert ref.transpose_method == "scan" and dg.transpose_method == ("exchange" if comm.size > 1 else "scan")
        # the transposed rows themselves, against the global scan (ascending CSR position per source)
        ip, tgt, _ = transposed_rows(indptr, indices, dg.lo, dg.hi)
        assert np.array_equal(dg._bwd.indptr.numpy(), ip) and np.array_equal(dg._bwd.indices.numpy(), tgt)
        for transposed in (False, True):
            a, b = ref.plan(kind, transposed), dg.plan(kind, transposed)
            for name in _PLAN_ARRAYS:
                va, vb = getattr(a, name), getattr(b, name)
                if isinstance(va, np.ndarray):
                    assert va.dtype == vb.dtype and np.array_equal(va, vb), (name, transposed)
                else:
                    assert va == vb, (name, transposed)


def test_bad_index_found_by_its_share(tmp_path):
    """An out-of-range index is found by the rank whose share holds it; comm.check tells all."""
    from mgg.data.validate import GraphFormatError, check_index_share
    from mgg.runtime import RankError

    comm = world()
    indptr, indices = random_csr(200, 1000, seed=5)
    indices = indices.copy()
    indices[-1] = 10_000  # in the last rank's share
    path = tmp_path / f"bad{comm.rank}.npz"
    np.savez(path, indptr=indptr, indices=indices)
    g = load_npz(path, mmap=True)  # cheap validation passes: values are not read
    err = None
    try:
        check_index_share(g, comm.rank, comm.size)
    except GraphFormatError as e:
        err = e
    assert (err is not None) == (comm.rank == comm.size - 1)
    with pytest.raises((GraphFormatError, RankError), match=r"indices\[%d\]=10000" % (len(indices) - 1)):
        comm.check(err)


@pytest.mark.parametrize("n,e,seed", [(1, 0, 0), (5, 40, 1), (300, 4000, 2), (1000, 30000, 3)])
def test_packed_and_pair_exchanges_equal_the_scan(n, e, seed):
    """Both all-to-all constructions (packed int64 pairs, and separate sources and targets) give
    `transposed_rows` of the whole CSR bit for bit, duplicates and self loops included."""
    from mgg.runtime.partition import partition_ranges
    from mgg.runtime.transpose import _exchange_packed, _exchange_pairs

    comm = world()
    indptr, indices = random_csr(n, e, seed=seed)
    bounds = partition_ranges(indptr, comm.size)
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    ip = indptr[lo: hi + 1] - indptr[lo]
    rows = indices[indptr[lo]: indptr[hi]].copy()
    want_ip, want_t, _ = transposed_rows(indptr, indices, lo, hi)
    for fn in (_exchange_packed, _exchange_pairs):
        got_ip, got_t = fn(ip, rows, bounds, comm.rank, comm)
        assert got_ip.dtype == np.int64 and got_t.dtype == np.int64, fn.__name__
        np.testing.assert_array_equal(got_ip, want_ip, err_msg=fn.__name__)
        np.testing.assert_array_equal(got_t, want_t, err_msg=fn.__name__)
    np.testing.assert_array_equal(rows, indices[indptr[lo]: indptr[hi]])  # the caller's rows untouched


def test_build_of_a_mapped_graph_takes_the_auto_rule(tmp_path, monkeypatch):
    """DistGraph.build leaves "auto" to auto_transpose: ranks whose GPUs can hold the CSR scan it."""
    import mgg.graph.dist_graph as dist_graph_mod

    comm = world()
    indptr, indices, mapped = _saved(tmp_path, 120, 900, 4)
    asked = []
    monkeypatch.setattr(dist_graph_mod, "auto_transpose", lambda ip, idx, p, backend, lr=0: asked.append(p) or "scan")
    with DistGraph.build(mapped, comm, RuntimeConfig(backend="cpu")) as dg:
        assert asked == [comm.size] and dg.transpose_method == "scan"
        ip, tgt, _ = transposed_rows(indptr, indices, dg.lo, dg.hi)
        assert np.array_equal(dg._bwd.indptr.numpy(), ip) and np.array_equal(dg._bwd.indices.numpy(), tgt)
