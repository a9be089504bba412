"""Row sharding of embedding tables over P ranks, and the layout of several tables in one array.

Every table is split over all P ranks; each rank's slice of the one symmetric array holds its rows
of every table, table after table (per-table row offsets `base[t]`):

* ``range``: rank r owns the contiguous rows ``[r * n_t, min(N, (r + 1) * n_t))`` of table t, where
  ``n_t = ceil(N / P)`` (equal slices, the last may be shorter); row g sits at local row
  ``base[t] + g - r * n_t``.
* ``hash``: row g is owned by rank ``g % P`` at local row ``base[t] + g // P``.

``rows_per_pe = sum_t ceil(N_t / P)``. Keys name a row of the concatenated row space:
``key = table_offset[t] + g`` (table_offset is the prefix sum of the cardinalities).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SHARDINGS", "TableLayout"]

SHARDINGS = ("range", "hash")


@dataclass(frozen=True)
class TableLayout:
    """Where every row of every table lives.

    Attributes:
        num_embeddings: rows of each table.
        sharding: "range" or "hash" for each table.
        world: number of PEs P.
    """

    num_embeddings: tuple[int, ...]
    sharding: tuple[str, ...]
    world: int

    def __post_init__(self):
        if self.world < 1:
            raise ValueError(f"world size must be >= 1, got {self.world}")
        if len(self.num_embeddings) != len(self.sharding) or not self.num_embeddings:
            raise ValueError("one sharding per table, at least one table")
        for n in self.num_embeddings:
            if int(n) < 1:
                raise ValueError(f"num_embeddings must be >= 1, got {n}")
        for s in self.sharding:
            if s not in SHARDINGS:
                raise ValueError(f"sharding must be one of {SHARDINGS}, got {s!r}")

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def num_tables(self) -> int:
        return len(self.num_embeddings)

    def slice_rows(self, t: int) -> int:
        """ceil(N_t / P): the rows of table t that every PE reserves."""
        return -(-int(self.num_embeddings[t]) // self.world)

    @property
    def base(self) -> np.ndarray:
        """int64 [T + 1]: table t occupies local rows [base[t], base[t + 1]) of every slice."""
        return np.concatenate([[0], np.cumsum([self.slice_rows(t) for t in range(self.num_tables)])]).astype(np.int64)

    @property
    def rows_per_pe(self) -> int:
        return int(self.base[-1])

    @property
    def table_offset(self) -> np.ndarray:
        """int64 [T + 1]: prefix sums of the cardinalities (key = table_offset[t] + row)."""
        return np.concatenate([[0], np.cumsum(self.num_embeddings)]).astype(np.int64)

    # -- address translation --------------------------------------------------------------------
    def locate(self, t: int, rows):
        """(owner PE, local row in the owner's slice) of rows `rows` (int64) of table t: numpy
        arrays for a numpy array or list, tensors on the same device for a torch tensor."""
        rows = rows.to(torch.int64) if isinstance(rows, torch.Tensor) else np.asarray(rows, dtype=np.int64)
        n_t, base = self.slice_rows(t), int(self.base[t])
        if self.sharding[t] == "range":
            owner = rows // n_t
            return owner, base + rows - owner * n_t
        return rows % self.world, base + rows // self.world

    def locate_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(table, owner, local row) of concatenated-space keys (int64)."""
        keys = np.asarray(keys, dtype=np.int64)
        off = self.table_offset
        table = np.searchsorted(off, keys, side="right") - 1
        owner = np.empty_like(keys)
        local = np.empty_like(keys)
        for t in range(self.num_tables):
            m = table == t
            if m.any():
                owner[m], local[m] = self.locate(t, keys[m] - off[t])
        return table, owner, local

    def owned_rows(self, t: int, pe: int) -> tuple[np.ndarray, np.ndarray]:
        """(global rows of table t owned by `pe`, their local rows), in local-row order."""
        n, n_t, base = int(self.num_embeddings[t]), self.slice_rows(t), int(self.base[t])
        if self.sharding[t] == "range":
            rows = np.arange(pe * n_t, min(n, (pe + 1) * n_t), dtype=np.int64)
            return rows, base + rows - pe * n_t
        rows = np.arange(pe, n, self.world, dtype=np.int64)
        return rows, base + rows // self.world

    def keys_of_local(self, pe: int, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of locate for PE `pe`: (table, global row) of local rows (must be valid rows)."""
        local = np.asarray(local, dtype=np.int64)
        base = self.base
        table = np.searchsorted(base, local, side="right") - 1
        rows = np.empty_like(local)
        for t in range(self.num_tables):
            m = table == t
            if m.any():
                j = local[m] - base[t]
                rows[m] = pe * self.slice_rows(t) + j if self.sharding[t] == "range" else j * self.world + pe
        return table, rows
