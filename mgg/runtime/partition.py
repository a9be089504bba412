"""Edge-balanced contiguous node ranges: the range-constrained binary search of MGG (Algorithm 1).

Each of the P ranks owns one contiguous range of node ids, so a global id translates to
(owner PE, row in the owner's slice) with one search over `bounds`, and the CSR of a rank is a
slice of the global CSR. Ranges are chosen so that every rank aggregates about E/P edges.
"""
from __future__ import annotations

import numpy as np

__all__ = ["partition_ranges", "owner_of", "range_sizes", "edge_counts"]


def _binary_search(indptr: np.ndarray, target: int, lo: int, hi: int) -> int:
    """Largest i in [lo, hi] with indptr[i] <= target (indptr monotone). The range constraint of
    Algorithm 1 is `lo`: a split never moves before the previous one."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if indptr[mid] <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def partition_ranges(indptr: np.ndarray, num_parts: int) -> np.ndarray:
    """Split nodes [0, N) into `num_parts` contiguous ranges with balanced edge counts.

    Algorithm 1 of MGG: for each split point, a binary search over the CSR row pointer restricted
    to [previous split, N]. One refinement over the paper's pseudo-code: the k-th search targets the
    cumulative count round(k * E / P) rather than "previous split + E/P", and takes whichever of the
    two neighbouring candidates lies closer to it. Errors then do not accumulate: every range holds
    E/P edges up to one maximum degree (the paper's version can leave the last rank with up to
    (P - 1) max-degree extra edges).

    Args:
        indptr: int64 [N + 1] CSR row pointer (monotone, indptr[0] == 0).
        num_parts: P >= 1. P > N is allowed: the surplus ranges are empty.

    Returns:
        bounds: int64 [P + 1], bounds[0] = 0, bounds[P] = N, non-decreasing; rank r owns
        [bounds[r], bounds[r + 1]).
    """
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or len(indptr) < 1:
        raise ValueError("partition_ranges: indptr must be a 1-D array with N + 1 >= 1 entries")
    if num_parts < 1:
        raise ValueError(f"partition_ranges: num_parts must be >= 1, got {num_parts}")
    n = len(indptr) - 1
    e = int(indptr[-1])
    bounds = np.empty(num_parts + 1, dtype=np.int64)
    bounds[0], bounds[num_parts] = 0, n
    last = 0
    for k in range(1, num_parts):
        target = (k * e + num_parts // 2) // num_parts
        i = _binary_search(indptr, target, last, n)
        if i < n and abs(int(indptr[i + 1]) - target) < abs(target - int(indptr[i])):
            i += 1  # the next split point lands closer to the target
        # node-count fallback for edgeless stretches: keep splitting nodes evenly among the
        # remaining ranks instead of piling every zero-degree node onto one rank
        if e == 0:
            i = max(last, (k * n) // num_parts)
        bounds[k] = i
        last = i
    return bounds


def range_sizes(bounds: np.ndarray) -> np.ndarray:
    """Nodes per rank, int64 [P]."""
    return np.diff(np.asarray(bounds, dtype=np.int64))


def edge_counts(indptr: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Edges (CSR entries) per rank, int64 [P]."""
    indptr = np.asarray(indptr, dtype=np.int64)
    return np.diff(indptr[np.asarray(bounds, dtype=np.int64)])


def owner_of(ids: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Owner rank (int32, same shape as `ids`) of each global node id.

    Empty ranges never own a node: `searchsorted(side="right") - 1` picks the last range whose
    lower bound is <= id, which is the non-empty one.
    """
    return (np.searchsorted(np.asarray(bounds, dtype=np.int64), ids, side="right") - 1).astype(np.int32)
