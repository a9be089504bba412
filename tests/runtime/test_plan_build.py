"""The vectorised plan construction (torch scans, counting sorts) against the former numpy
construction, kept here as the reference: plans and transposed rows must be bit-identical."""
import dataclasses

import numpy as np
import pytest

from mgg.runtime.partition import owner_of, partition_ranges
from mgg.runtime.plan import PlanParams, build_plan, cut_partitions, cut_remote, warp_worklist
from mgg.runtime.transpose import transposed_rows
from tests.graphs import random_csr


def _reference_split(row_indptr, row_indices, row_weight, bounds, rank, node_of_pe):
    """build_plan's local/remote split and halo as written before (lexsort, np.unique)."""
    world = len(bounds) - 1
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    n = hi - lo
    target = np.repeat(np.arange(n, dtype=np.int64), np.diff(row_indptr))
    is_local = (row_indices >= lo) & (row_indices < hi)
    l_idx = np.flatnonzero(is_local)
    r_idx = np.flatnonzero(~is_local)
    r_inter = node_of_pe[owner_of(row_indices[r_idx], bounds)] != node_of_pe[rank]
    r_idx = r_idx[np.lexsort((r_inter, target[r_idx]))]
    local_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(target[l_idx], minlength=n), out=local_indptr[1:])
    remote_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(target[r_idx], minlength=n), out=remote_indptr[1:])
    remote_src = row_indices[r_idx]
    remote_pe = owner_of(remote_src, bounds)
    remote_row = remote_src - bounds[remote_pe]
    same_node = node_of_pe[remote_pe] == node_of_pe[rank]
    remote_split = remote_indptr[:-1] + np.bincount(target[r_idx][same_node], minlength=n)
    halo_ids, remote_slot = np.unique(remote_src, return_inverse=True)
    halo_pe = owner_of(halo_ids, bounds)
    halo_ptr = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(np.bincount(halo_pe, minlength=world), out=halo_ptr[1:])
    return dict(local_indptr=local_indptr, local_indices=row_indices[l_idx] - lo,
                local_weight=row_weight[l_idx], remote_indptr=remote_indptr,
                remote_pe=remote_pe.astype(np.int32), remote_row=remote_row.astype(np.int64),
                remote_weight=row_weight[r_idx], remote_split=remote_split, halo_ptr=halo_ptr,
                halo_row=(halo_ids - bounds[halo_pe]).astype(np.int64),
                remote_slot=remote_slot.astype(np.int64).reshape(-1))


def _reference_transposed(indptr, indices, lo, hi):
    """DistGraph._transposed_rows as written before (searchsorted + stable argsort)."""
    n = hi - lo
    sel = np.flatnonzero((indices >= lo) & (indices < hi))
    src = indices[sel]
    tgt = np.searchsorted(indptr, sel, side="right") - 1
    order = np.argsort(src, kind="stable")
    src, tgt = src[order], tgt[order]
    ip = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src - lo, minlength=n), out=ip[1:])
    return ip, tgt.astype(np.int64), src


def _graphs():
    yield random_csr(1, 0, 0, self_loops=0, isolated=0, duplicates=0)       # one node, no edge
    yield random_csr(7, 0, 1, self_loops=0, isolated=0, duplicates=0)       # edgeless
    yield random_csr(5, 40, 2, isolated=0)                                 # dense, duplicates
    for seed in range(3, 9):
        yield random_csr(int(40 + 37 * seed), int(300 * seed), seed)         # isolated, loops, dups
    # hubs at the front: the default partition then leaves ranks with very different sizes
    ip, ind = random_csr(200, 3000, 9)
    ind = np.where(np.arange(len(ind)) % 3 == 0, ind % 5, ind)
    yield ip, ind


def _bounds(indptr, world):
    yield partition_ranges(indptr, world)
    yield partition_ranges(indptr, world, beta=0.0)
    n = len(indptr) - 1
    yield np.array([0] * world + [n], dtype=np.int64)  # every rank but the last empty
    yield np.array([0] + [n] * world, dtype=np.int64)  # every rank but the first empty


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_plans_match_reference(world):
    checked = 0
    for indptr, indices in _graphs():
        w = (np.arange(len(indices)) % 97 + 1).astype(np.float32)
        for b in _bounds(indptr, world):
            for node_of_pe in (None, np.arange(world) // 2, np.arange(world)):
                for r in range(world):
                    a, e = indptr[b[r]], indptr[b[r + 1]]
                    rip = indptr[b[r]: b[r + 1] + 1] - a
                    params = PlanParams(3, 2, 2, 2)
                    plan = build_plan(rip, indices[a:e], w[a:e], None, b, r, params, node_of_pe)
                    nop = np.zeros(world, np.int32) if node_of_pe is None else node_of_pe.astype(np.int32)
                    ref = _reference_split(rip, indices[a:e], w[a:e], b, r, nop)
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
    for indptr, indices in _graphs():
        for b in _bounds(indptr, world):
            for r in range(world):
                lo, hi = int(b[r]), int(b[r + 1])
                got = transposed_rows(indptr, indices, lo, hi, method=method)
                want = _reference_transposed(indptr, indices, lo, hi)
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
