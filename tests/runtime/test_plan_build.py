"""The vectorised plan construction (torch scans, counting sorts) against the numpy construction
of mgg.testing.plan_reference: plans and transposed rows must be bit-identical."""
import dataclasses

import numpy as np
import pytest

from mgg.runtime.partition import partition_ranges
from mgg.runtime.plan import PlanParams, build_plan, cut_partitions, cut_remote, warp_worklist
from mgg.runtime.transpose import transposed_rows
from mgg.testing.graphs import random_csr
from mgg.testing.plan_reference import plan_test_graphs, reference_split, reference_transposed


def _bounds(indptr, world):
    yield partition_ranges(indptr, world)
    yield partition_ranges(indptr, world, beta=0.0)
    n = len(indptr) - 1
    yield np.array([0] * world + [n], dtype=np.int64)  # every rank but the last empty
    yield np.array([0] + [n] * world, dtype=np.int64)  # every rank but the first empty


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_plans_match_reference(world):
    checked = 0
    for indptr, indices in plan_test_graphs():
        w = (np.arange(len(indices)) % 97 + 1).astype(np.float32)
        for b in _bounds(indptr, world):
            for node_of_pe in (None, np.arange(world) // 2, np.arange(world)):
                for r in range(world):
                    a, e = indptr[b[r]], indptr[b[r + 1]]
                    rip = indptr[b[r]: b[r + 1] + 1] - a
                    params = PlanParams(3, 2, 2, 2)
                    plan = build_plan(rip, indices[a:e], w[a:e], None, b, r, params, node_of_pe)
                    nop = np.zeros(world, np.int32) if node_of_pe is None else node_of_pe.astype(np.int32)
                    ref = reference_split(rip, indices[a:e], w[a:e], b, r, nop)
                    for k, v in ref.items():
                        got = getattr(plan, k)
                        assert got.dtype == v.dtype and np.array_equal(got, v), (k, world, r)
                    lp = cut_partitions(ref["local_indptr"], 3)
                    rp, inter = cut_remote(ref["remote_indptr"], ref["remote_split"], 3, 2)
                    assert np.array_equal(plan.local_parts, lp) and np.array_equal(plan.remote_parts, rp)
                    assert np.array_equal(plan.remote_part_inter, inter)
                    assert np.array_equal(plan.warps, warp_worklist(len(lp), len(rp), 2))
                    checked += 1
    assert checked > 100


@pytest.mark.parametrize("method", ["counting", "torch"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_transposed_rows_match_reference(method, world):
    for indptr, indices in plan_test_graphs():
        for b in _bounds(indptr, world):
            for r in range(world):
                lo, hi = int(b[r]), int(b[r + 1])
                got = transposed_rows(indptr, indices, lo, hi, method=method)
                want = reference_transposed(indptr, indices, lo, hi)
                for g, w_ in zip(got, want):
                    assert g.dtype == np.int64 and np.array_equal(g, w_), (method, world, r)


def test_transposed_rows_match_scipy_transpose():
    import scipy.sparse as sp

    indptr, indices = random_csr(500, 8000, 3)
    n = len(indptr) - 1
    A = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n))
    At = A.T.tocsr()
    At.sum_duplicates()
    ip, tgt, src = transposed_rows(indptr, indices, 0, n)
    B = sp.csr_matrix((np.ones(len(tgt)), tgt, ip), shape=(n, n))
    B.sum_duplicates()
    assert np.array_equal(B.indptr, At.indptr) and np.array_equal(B.indices, At.indices)
    assert np.array_equal(B.data, At.data)
    assert np.all(np.diff(tgt)[np.diff(src) == 0] >= 0)  # targets ascend inside a row


def test_build_plan_on_read_only_inputs():
    indptr, indices = random_csr(50, 400, 1)
    b = partition_ranges(indptr, 2)
    a, e = indptr[b[0]], indptr[b[1]]
    rip, ind = indptr[: b[1] + 1] - a, indices[a:e].copy()
    w = np.ones(len(ind), np.float32)
    for x in (rip, ind, w):
        x.flags.writeable = False
    p = build_plan(rip, ind, w, None, b, 0)
    q = build_plan(rip.copy(), ind.copy(), w.copy(), None, b, 0)
    for f in dataclasses.fields(p):
        assert np.array_equal(np.asarray(getattr(p, f.name)), np.asarray(getattr(q, f.name))), f.name
