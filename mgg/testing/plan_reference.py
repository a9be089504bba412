"""The plan construction as first written in numpy (lexsort, np.unique, searchsorted + stable
argsort): the reference the vectorised torch construction (mgg.runtime.plan.build_plan,
mgg.runtime.transpose.transposed_rows, DistGraph's plan path) must equal bit for bit, and the
graphs those checks run on."""
from __future__ import annotations

import numpy as np

from ..runtime.partition import owner_of
from .graphs import random_csr

__all__ = ["reference_split", "reference_transposed", "plan_test_graphs"]


def reference_split(row_indptr, row_indices, row_weight, bounds, rank, node_of_pe):
    """build_plan's local/remote split and halo in numpy (lexsort, np.unique): a dict of the
    AggregationPlan fields it sets."""
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
    return dict(local_indptr=local_indptr, local_indices=(row_indices[l_idx] - lo).astype(np.int32),
                local_weight=row_weight[l_idx], remote_indptr=remote_indptr,
                remote_pe=remote_pe.astype(np.int32), remote_row=remote_row.astype(np.int32),
                remote_weight=row_weight[r_idx], remote_split=remote_split, halo_ptr=halo_ptr,
                halo_row=(halo_ids - bounds[halo_pe]).astype(np.int64),
                remote_slot=remote_slot.astype(np.int32).reshape(-1))


def reference_transposed(indptr, indices, lo, hi):
    """The transposed rows [lo, hi) in numpy (searchsorted + stable argsort): (indptr, targets,
    sources), int64."""
    n = hi - lo
    sel = np.flatnonzero((indices >= lo) & (indices < hi))
    src = indices[sel]
    tgt = np.searchsorted(indptr, sel, side="right") - 1
    order = np.argsort(src, kind="stable")
    src, tgt = src[order], tgt[order]
    ip = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src - lo, minlength=n), out=ip[1:])
    return ip, tgt.astype(np.int64), src


def plan_test_graphs():
    """The graphs the plan builds are checked on: (indptr, indices) int64 pairs, from one node
    without edges to hub rows at the front that leave ranks very different sizes."""
    yield random_csr(1, 0, 0, self_loops=0, isolated=0, duplicates=0)       # one node, no edge
    yield random_csr(7, 0, 1, self_loops=0, isolated=0, duplicates=0)       # edgeless
    yield random_csr(5, 40, 2, isolated=0)                                 # dense, duplicates
    for seed in range(3, 9):
        yield random_csr(int(40 + 37 * seed), int(300 * seed), seed)         # isolated, loops, dups
    # hubs at the front: the default partition then leaves ranks with very different sizes
    ip, ind = random_csr(200, 3000, 9)
    ind = np.where(np.arange(len(ind)) % 3 == 0, ind % 5, ind)
    yield ip, ind
