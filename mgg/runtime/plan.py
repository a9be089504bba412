"""Per-rank aggregation plans: local/remote CSR split, neighbor partitions, warp worklist.

This is MGG sections 4.1-5.2 as data. A rank owning global nodes [lo, hi) keeps:

* the **local CSR**: for each of its targets, the neighbors inside [lo, hi), rebased to local ids;
* the **remote CSR**: the neighbors owned by other ranks, each stored as (owner PE, row in the
  owner's symmetric slice): the address translation of MGG Fig. 4;
* both cut into **neighbor partitions** of at most `ps` neighbors, each a (target, start, end)
  triple into its CSR (a node with 0 neighbors gets no partition);
* the **warp worklist** of §5.1: numWarps = ceil(max(#local, #remote) / dist); warp w owns local
  partitions [w*dist, (w+1)*dist) and remote partitions [w*dist, (w+1)*dist), processed as
  interleaved pairs (issue remote get k, aggregate local k, wait, aggregate remote k);
  numBlocks = ceil(numWarps / wpb); dynamic shared memory per block from Eq. 1;
* the **halo**: the unique remote (PE, row) pairs, sorted by PE, and for every remote edge its
  slot in the halo (the CPU executor and the GPU halo variant fetch each unique row once).

Plans are plain dataclasses of numpy arrays; `save`/`load` write and read them as .npz
(atomically). One plan feeds the CPU executor and the GPU kernels alike.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import zipfile
from dataclasses import dataclass, field

import numpy as np

from .partition import owner_of

__all__ = ["AggregationPlan", "build_plan", "cut_partitions", "warp_worklist", "smem_bytes",
           "PlanParams", "INT_BYTES", "FLOAT_BYTES"]

INT_BYTES = 4
FLOAT_BYTES = 4


@dataclass(frozen=True)
class PlanParams:
    """The three knobs of MGG: neighbor-partition size, interleave distance, warps per block."""

    ps: int = 16
    dist: int = 4
    wpb: int = 4

    def __post_init__(self) -> None:
        for name, lo, hi in (("ps", 1, 1024), ("dist", 1, 64), ("wpb", 1, 32)):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")


def cut_partitions(indptr: np.ndarray, ps: int) -> np.ndarray:
    """Cut every CSR row into chunks of at most `ps` entries.

    Args:
        indptr: int64 [n + 1].
        ps: partition size >= 1.

    Returns:
        int64 [num_parts, 3] of (target row, start, end), ordered by target then start; rows with
        no entries get no partition.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    deg = np.diff(indptr)
    nparts = (deg + ps - 1) // ps
    total = int(nparts.sum())
    target = np.repeat(np.arange(len(deg), dtype=np.int64), nparts)
    first = np.cumsum(nparts) - nparts  # index of each row's first partition
    k = np.arange(total, dtype=np.int64) - np.repeat(first, nparts)  # chunk number inside its row
    start = indptr[target] + k * ps
    end = np.minimum(start + ps, indptr[target + 1])
    return np.stack([target, start, end], axis=1) if total else np.zeros((0, 3), dtype=np.int64)


def warp_worklist(num_local_parts: int, num_remote_parts: int, dist: int) -> np.ndarray:
    """Warp-to-partition mapping of §5.1 (Eq. 2).

    Returns:
        int64 [numWarps, 4] of (local_begin, local_end, remote_begin, remote_end): warp w owns
        local partitions [local_begin, local_end) and remote ones [remote_begin, remote_end),
        `dist` of each (fewer at the tail); numWarps = ceil(max(local, remote) / dist).
    """
    num_warps = -(-max(num_local_parts, num_remote_parts) // dist)
    w = np.arange(num_warps, dtype=np.int64) * dist
    return np.stack([np.minimum(w, num_local_parts), np.minimum(w + dist, num_local_parts),
                     np.minimum(w, num_remote_parts), np.minimum(w + dist, num_remote_parts)],
                    axis=1) if num_warps else np.zeros((0, 4), dtype=np.int64)


def smem_bytes(ps: int, wpb: int, dim: int) -> int:
    """Eq. 1: SMEM = ps * wpb * IntS + 2 * wpb * D * FloatS (neighbor ids, partial sums, remote buffer)."""
    return ps * wpb * INT_BYTES + 2 * wpb * dim * FLOAT_BYTES


@dataclass
class AggregationPlan:
    """One rank's plan for out = W x (+ diag * x) over its target nodes [lo, hi).

    Shapes: n = hi - lo local targets; El local and Er remote CSR entries; Lp/Rp local/remote
    partitions; H unique remote rows; P world size.
    """

    rank: int
    world_size: int
    lo: int
    hi: int
    rows_per_pe: int
    ps: int
    dist: int
    wpb: int
    local_indptr: np.ndarray    # int64 [n + 1]
    local_indices: np.ndarray   # int64 [El], local source rows in [0, n)
    local_weight: np.ndarray    # float32 [El]
    remote_indptr: np.ndarray   # int64 [n + 1]
    remote_pe: np.ndarray       # int32 [Er], owner PE of each remote source
    remote_row: np.ndarray      # int64 [Er], row of the source in the owner's slice
    remote_weight: np.ndarray   # float32 [Er]
    self_weight: np.ndarray     # float32 [n] (zeros when the kind has no self term)
    local_parts: np.ndarray     # int64 [Lp, 3] (target, start, end) into local_indices
    remote_parts: np.ndarray    # int64 [Rp, 3] (target, start, end) into remote_*
    warps: np.ndarray           # int64 [numWarps, 4] (lb, le, rb, re), see warp_worklist
    halo_ptr: np.ndarray        # int64 [P + 1], halo entries of PE p are [halo_ptr[p], halo_ptr[p+1])
    halo_row: np.ndarray        # int64 [H], row in the owner's slice, sorted within each PE
    remote_slot: np.ndarray     # int64 [Er], index of each remote entry's row in the halo
    has_self: bool = False

    # -- derived sizes (Eq. 2-3) ------------------------------------------------------------
    @property
    def n_local(self) -> int:
        return self.hi - self.lo

    @property
    def num_warps(self) -> int:
        return int(self.warps.shape[0])

    @property
    def num_blocks(self) -> int:
        return -(-self.num_warps // self.wpb)

    def smem_bytes(self, dim: int) -> int:
        return smem_bytes(self.ps, self.wpb, dim)

    @property
    def num_local_edges(self) -> int:
        return int(self.local_indices.shape[0])

    @property
    def num_remote_edges(self) -> int:
        return int(self.remote_row.shape[0])

    @property
    def halo_size(self) -> int:
        return int(self.halo_row.shape[0])

    def halo_pe(self) -> np.ndarray:
        """int32 [H]: owner PE of each halo row."""
        return np.repeat(np.arange(self.world_size, dtype=np.int32), np.diff(self.halo_ptr))

    def stats(self) -> dict:
        return {"rank": self.rank, "n_local": self.n_local, "local_edges": self.num_local_edges,
                "remote_edges": self.num_remote_edges, "halo_rows": self.halo_size,
                "local_parts": int(self.local_parts.shape[0]),
                "remote_parts": int(self.remote_parts.shape[0]), "num_warps": self.num_warps,
                "num_blocks": self.num_blocks, "ps": self.ps, "dist": self.dist, "wpb": self.wpb}

    def with_params(self, params: PlanParams) -> "AggregationPlan":
        """The same split re-cut for other (ps, dist, wpb): partitions and worklist change only."""
        lp = cut_partitions(self.local_indptr, params.ps)
        rp = cut_partitions(self.remote_indptr, params.ps)
        return dataclasses.replace(self, ps=params.ps, dist=params.dist, wpb=params.wpb,
                                   local_parts=lp, remote_parts=rp,
                                   warps=warp_worklist(len(lp), len(rp), params.dist))

    # -- serialisation ----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as .npz atomically (temp file in the same folder, then rename)."""
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        arrays = {f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".plan-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "AggregationPlan":
        try:
            with np.load(path, allow_pickle=False) as z:
                kw = {}
                for f in dataclasses.fields(cls):
                    if f.name not in z:
                        raise ValueError(f"{os.fspath(path)}: plan field {f.name!r} is missing")
                    a = z[f.name]
                    kw[f.name] = a.item() if a.ndim == 0 else a
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise ValueError(f"{os.fspath(path)}: not a valid mgg plan: {e}") from e
        for k in ("rank", "world_size", "lo", "hi", "rows_per_pe", "ps", "dist", "wpb"):
            kw[k] = int(kw[k])
        kw["has_self"] = bool(kw["has_self"])
        return cls(**kw)


def build_plan(row_indptr: np.ndarray, row_indices: np.ndarray, row_weight: np.ndarray,
               self_weight: np.ndarray | None, bounds: np.ndarray, rank: int,
               params: PlanParams = PlanParams()) -> AggregationPlan:
    """Build rank `rank`'s plan from its rows of the weighted global CSR.

    Args:
        row_indptr: int64 [n + 1], the rank's CSR rows rebased so row_indptr[0] == 0.
        row_indices: int64 [E_r], GLOBAL source ids of those rows.
        row_weight: float [E_r], the weight of each entry.
        self_weight: float [n] diagonal weights, or None.
        bounds: int64 [P + 1] from `partition_ranges`.
        rank: this rank.
        params: ps, dist, wpb.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    world = len(bounds) - 1
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    n = hi - lo
    row_indptr = np.asarray(row_indptr, dtype=np.int64)
    row_indices = np.asarray(row_indices, dtype=np.int64)
    row_weight = np.asarray(row_weight, dtype=np.float32)
    if len(row_indptr) != n + 1 or int(row_indptr[-1]) != len(row_indices) or len(row_weight) != len(row_indices):
        raise ValueError(f"build_plan: rank {rank} rows disagree: {len(row_indptr) - 1} rows for range "
                         f"[{lo}, {hi}), {len(row_indices)} indices, {len(row_weight)} weights")
    rows_per_pe = max(1, int(np.diff(bounds).max()))
    target = np.repeat(np.arange(n, dtype=np.int64), np.diff(row_indptr))
    is_local = (row_indices >= lo) & (row_indices < hi)

    # stable split keeps CSR order inside each row
    l_idx = np.flatnonzero(is_local)
    r_idx = np.flatnonzero(~is_local)
    local_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(target[l_idx], minlength=n), out=local_indptr[1:])
    remote_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(target[r_idx], minlength=n), out=remote_indptr[1:])

    remote_src = row_indices[r_idx]
    remote_pe = owner_of(remote_src, bounds)
    remote_row = remote_src - bounds[remote_pe]

    # halo: unique remote sources; global ids sort by (PE, row) because ranges are contiguous
    halo_ids, remote_slot = np.unique(remote_src, return_inverse=True)
    halo_pe = owner_of(halo_ids, bounds)
    halo_ptr = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(np.bincount(halo_pe, minlength=world), out=halo_ptr[1:])

    lp = cut_partitions(local_indptr, params.ps)
    rp = cut_partitions(remote_indptr, params.ps)
    sw = np.zeros(n, dtype=np.float32) if self_weight is None else np.asarray(self_weight, np.float32)
    return AggregationPlan(
        rank=rank, world_size=world, lo=lo, hi=hi, rows_per_pe=rows_per_pe,
        ps=params.ps, dist=params.dist, wpb=params.wpb,
        local_indptr=local_indptr, local_indices=row_indices[l_idx] - lo,
        local_weight=row_weight[l_idx], remote_indptr=remote_indptr,
        remote_pe=remote_pe.astype(np.int32), remote_row=remote_row.astype(np.int64),
        remote_weight=row_weight[r_idx], self_weight=sw,
        local_parts=lp, remote_parts=rp, warps=warp_worklist(len(lp), len(rp), params.dist),
        halo_ptr=halo_ptr, halo_row=(halo_ids - bounds[halo_pe]).astype(np.int64),
        remote_slot=remote_slot.astype(np.int64).reshape(-1), has_self=self_weight is not None)
