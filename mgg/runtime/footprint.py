"""What each rank of a P-rank run holds, computed from a graph file without training.

`rank_footprints` cuts the graph with `partition_ranges` (the cut training uses, same beta) and
reads each rank's share of ``indices`` in chunks (a memory map is never read whole), so a graph
larger than the host can be sized for P ranks on that host.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .partition import partition_ranges

__all__ = ["RankFootprint", "rank_footprints"]

_CHUNK = 1 << 24  # entries of indices read at a time (128 MiB of int64)


@dataclass(frozen=True)
class RankFootprint:
    """One rank's share: node range [lo, hi), its in-edges (CSR rows), how many of those come
    from other ranks (`remote_edges`) and from how many distinct remote nodes (`remote_rows`:
    the rows a halo gather moves once per layer width), the host bytes of its rows and node data
    (`host_bytes`: indptr + indices slices, features, labels, masks) and `rows_per_pe` (the
    largest rank's node count: every GPU's symmetric heap holds that many rows per stored array)."""

    rank: int
    lo: int
    hi: int
    edges: int
    remote_edges: int
    remote_rows: int
    host_bytes: int
    rows_per_pe: int

    @property
    def nodes(self) -> int:
        return self.hi - self.lo

    def heap_bytes(self, width: int, itemsize: int = 4) -> int:
        """Symmetric-heap bytes of one stored array of `width` columns (the same on every GPU)."""
        return self.rows_per_pe * int(width) * int(itemsize)


def rank_footprints(indptr: np.ndarray, indices: np.ndarray, world_size: int, num_features: int = 0,
                    beta: float | None = None) -> list[RankFootprint]:
    """Every rank's RankFootprint for `world_size` ranks. `indptr` int64 [N+1] (in memory),
    `indices` int64 [E] (may be an np.memmap: read one chunk of one rank at a time), `num_features`
    F (float32 features: 4 F bytes per node), `beta`: as `partition_ranges` (None: its default).
    Memory: one bool [N] mask and one chunk."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n = len(indptr) - 1
    kw = {} if beta is None else {"beta": beta}
    bounds = partition_ranges(indptr, world_size, **kw)
    rows_per_pe = max(1, int(np.diff(bounds).max()))
    seen = np.zeros(n, dtype=bool)
    out = []
    for r in range(world_size):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        a, b = int(indptr[lo]), int(indptr[hi])
        seen[:] = False
        remote_edges = 0
        for s in range(a, b, _CHUNK):
            src = np.asarray(indices[s: min(b, s + _CHUNK)])
            far = src[(src < lo) | (src >= hi)]
            remote_edges += len(far)
            seen[far] = True
        node_bytes = (hi - lo) * (4 * int(num_features) + 8 + 3)  # x, y (int64), 3 masks
        host = 8 * (hi - lo + 1) + 8 * (b - a) + node_bytes
        out.append(RankFootprint(r, lo, hi, b - a, remote_edges, int(seen.sum()), host, rows_per_pe))
    return out
