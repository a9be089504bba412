"""What each rank of a P-rank run holds, computed from a graph file without training.

`rank_footprints` cuts the graph with `partition_ranges` (the cut training uses, same beta) and
reads each rank's share of ``indices`` in chunks (a memory map is never read whole), so a graph
larger than the host can be sized for P ranks on that host.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.rows import read_rows
from .partition import partition_ranges

__all__ = ["RankFootprint", "rank_footprints", "footprints_from_chunks", "array_chunks"]

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


class _Tally:
    """Running counts of one P while the edges stream by in CSR order (rank after rank)."""

    def __init__(self, indptr: np.ndarray, world_size: int, num_features: int, beta: float | None):
        kw = {} if beta is None else {"beta": beta}
        self.indptr, self.P, self.F = indptr, int(world_size), int(num_features)
        self.bounds = partition_ranges(indptr, world_size, **kw)
        self.ebounds = indptr[self.bounds]  # edge range of every rank
        self.rows_per_pe = max(1, int(np.diff(self.bounds).max()))
        self.seen = np.zeros(len(indptr) - 1, dtype=bool)
        self.rank, self.remote_edges, self.out = 0, 0, []
        self._skip_empty(0)

    def _finish(self) -> None:
        r = self.rank
        lo, hi = int(self.bounds[r]), int(self.bounds[r + 1])
        edges = int(self.ebounds[r + 1] - self.ebounds[r])
        host = 8 * (hi - lo + 1) + 8 * edges + (hi - lo) * (4 * self.F + 8 + 3)  # x, y (int64), 3 masks
        self.out.append(RankFootprint(r, lo, hi, edges, self.remote_edges, int(self.seen.sum()), host,
                                      self.rows_per_pe))
        self.seen[:] = False
        self.rank, self.remote_edges = r + 1, 0

    def _skip_empty(self, at: int) -> None:
        """Close the ranks whose edges all lie before edge `at` (those without edges included); a
        rank is closed as soon as its last edge is counted, so none is closed twice."""
        while self.rank < self.P and self.ebounds[self.rank + 1] <= at:
            self._finish()

    def add(self, e0: int, src: np.ndarray) -> None:
        """Sources of CSR entries [e0, e0 + len(src)), in order."""
        at, end = e0, e0 + len(src)
        while at < end:
            self._skip_empty(at)
            r = self.rank
            lo, hi = int(self.bounds[r]), int(self.bounds[r + 1])
            stop = min(end, int(self.ebounds[r + 1]))
            piece = src[at - e0: stop - e0]
            far = piece[(piece < lo) | (piece >= hi)]
            self.remote_edges += len(far)
            self.seen[far] = True
            at = stop
            if at == int(self.ebounds[r + 1]):
                self._finish()

    def result(self) -> list[RankFootprint]:
        while self.rank < self.P:
            self._finish()
        return self.out


def footprints_from_chunks(indptr: np.ndarray, chunks, world_sizes: list[int], num_features: int = 0,
                           beta: float | None = None) -> dict[int, list[RankFootprint]]:
    """{P: every rank's RankFootprint} for each P of `world_sizes` in one pass over `chunks`, an
    iterator of (e0, e1, sources) covering CSR entries [0, E) in order (numpy or tensors; e.g. a
    generator's chunks, so a graph can be sized while it is drawn, without storing its edges).
    Memory: one bool [N] mask per P and one chunk."""
    indptr = np.asarray(indptr, dtype=np.int64)
    tallies = [_Tally(indptr, p, num_features, beta) for p in world_sizes]
    at = 0
    for e0, e1, src in chunks:
        if e0 != at:
            raise ValueError(f"chunks are not contiguous: expected one starting at {at}, got [{e0}, {e1})")
        src = src.cpu().numpy() if hasattr(src, "cpu") else np.asarray(src)
        for t in tallies:
            t.add(e0, src)
        at = e1
    if at != int(indptr[-1]):
        raise ValueError(f"chunks cover {at} of {int(indptr[-1])} edges")
    return {p: t.result() for p, t in zip(world_sizes, tallies)}


def array_chunks(indices, total: int):
    """(s, e, indices[s:e]) in chunks; a memory map is read with positioned reads (its pages do
    not stay in this process's resident set)."""
    for s in range(0, total, _CHUNK):
        e = min(total, s + _CHUNK)
        yield s, e, read_rows(indices, s, e)


def rank_footprints(indptr: np.ndarray, indices: np.ndarray, world_size: int, num_features: int = 0,
                    beta: float | None = None) -> list[RankFootprint]:
    """Every rank's RankFootprint for `world_size` ranks. `indptr` int64 [N+1] (in memory),
    `indices` int64 [E] (may be an np.memmap: read one chunk at a time), `num_features` F
    (float32 features: 4 F bytes per node), `beta`: as `partition_ranges` (None: its default).
    Memory: one bool [N] mask and one chunk."""
    indptr = np.asarray(indptr, dtype=np.int64)
    total = int(indptr[-1])
    return footprints_from_chunks(indptr, array_chunks(indices, total), [world_size], num_features, beta)[world_size]
