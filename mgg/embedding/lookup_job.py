"""One lookup request in the batcher: looked up whole in one pass, or in parts of bounded work.

A part is bags [c, e) restricted to ids [u, u1): every bag of a request whose ids span more than
one part (at most the first and the last bag of a part) is looked up piecewise and its pieces
are combined as its table's mode requires -- sum: added; mean: the pieces' sums added and divided
by the bag's size; max: the elementwise maximum. So even a request of one bag of millions of ids
is looked up in passes of at most `units` ids and bags, and the other requests are never behind
more than one such pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .lookup_request import BadRequest, LookupRequest

__all__ = ["LookupJob", "JobPart"]


@dataclass(frozen=True)
class JobPart:
    """Bags [c, e) of a job restricted to its ids [u, u1)."""

    job: "LookupJob"
    c: int
    e: int
    u: int
    u1: int

    @property
    def whole(self) -> bool:
        return self.c == 0 and self.e == self.job.num_bags and self.u == 0 and self.u1 == self.job.num_ids

    def local_offsets(self) -> np.ndarray:
        """Offsets of the part's bags into ids [u, u1) (int64 [e - c]; the first bag from 0)."""
        return np.maximum(self.job.offsets[self.c: self.e], self.u) - self.u


class LookupJob:
    """One lookup request in flight. `out` [B, D] float32 fills as parts are looked up; `on_done(job)`
    is called (from the batcher thread) once, with `out` or `error`."""

    __slots__ = ("req", "offsets", "num_bags", "num_ids", "bag_cursor", "id_cursor", "chunked", "out", "error",
                 "on_done", "cancelled")

    def __init__(self, req: LookupRequest, on_done: Callable[["LookupJob"], None]):
        self.req, self.on_done = req, on_done
        self.offsets = req.bag.offsets.numpy()  # int64 [B + 1], offsets[-1] = number of ids
        self.num_bags = req.bag.num_bags
        self.num_ids = int(self.offsets[-1])
        self.bag_cursor = self.id_cursor = 0  # bags before bag_cursor and ids before id_cursor are done
        self.chunked = False  # looked up in parts (once it is, until it is done)
        self.out: np.ndarray | None = None
        self.error: BadRequest | None = None
        self.cancelled = False  # the client is gone: skipped at the next plan

    @property
    def done(self) -> bool:
        return self.bag_cursor >= self.num_bags

    def remaining_units(self) -> int:
        """Work left: ids + bags."""
        return (self.num_ids - self.id_cursor) + (self.num_bags - self.bag_cursor)

    def whole_part(self) -> JobPart:
        return JobPart(self, 0, self.num_bags, 0, self.num_ids)

    def next_part(self, units: int) -> JobPart:
        """The next part from the cursors on: at most `units` ids and `units` bags, at least one bag
        or one id."""
        off, B, n = self.offsets, self.num_bags, self.num_ids
        c, u = self.bag_cursor, self.id_cursor
        u1 = min(n, u + units)
        e = B if u1 >= n else int(np.searchsorted(off[:B], u1, side="left"))  # bags starting before u1
        e = max(c + 1, min(e, c + units))
        if e < B:
            u1 = min(u1, int(off[e]))  # ids of later bags wait for a later part
        return JobPart(self, c, e, u, u1)

    def take(self, part: JobPart, rows: np.ndarray, mode: str) -> None:
        """Store the pooled rows [e - c, D] of `part` (pooled over the part's ids only) and move the
        cursors past it."""
        if part.whole:
            self.out = rows
            self.bag_cursor, self.id_cursor = self.num_bags, self.num_ids
            return
        self.chunked = True
        off, c, e, u, u1 = self.offsets, part.c, part.e, part.u, part.u1
        if self.out is None:
            self.out = np.zeros((self.num_bags, rows.shape[1]), dtype=np.float32)
        rows = np.array(rows, dtype=np.float32)  # own copy: the split bags are rescaled in place
        continued = off[c] < u  # bag c has pieces in earlier parts
        open_end = off[e] > u1  # bag e - 1 has pieces in later parts
        if mode == "mean":  # pieces of split bags as sums
            split = ([c] if continued else []) + ([e - 1] if open_end and not (continued and e - 1 == c) else [])
            for b in split:
                rows[b - c] *= min(off[b + 1], u1) - max(off[b], u)
        if continued:
            if mode == "max":
                np.maximum(rows[0], self.out[c], out=rows[0])
            else:
                rows[0] += self.out[c]
            if mode == "mean" and not (open_end and e - 1 == c):
                rows[0] /= off[c + 1] - off[c]
        self.out[c:e] = rows
        self.bag_cursor = e - 1 if open_end else e
        self.id_cursor = u1
