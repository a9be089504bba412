"""Per-rank aggregation plans: local/remote CSR split, neighbor partitions, warp worklist.

This is MGG sections 4.1-5.2 as data. A rank owning global nodes [lo, hi) keeps:

* the **local CSR**: for each of its targets, the neighbors inside [lo, hi), rebased to local ids;
* the **remote CSR**: the neighbors owned by other ranks, each stored as (owner PE, row in the
  owner's symmetric slice): the address translation of MGG Fig. 4;
* both cut into **neighbor partitions** of at most `ps` neighbors, each a (target, start, end)
  triple into its CSR (a node with 0 neighbors gets no partition). Plans are **node-aware**
  (MGG 4.1): inside each row the remote entries owned by PEs of this node come first, those on
  other nodes after them, and the other-node class is cut with its own, smaller `ps_inter`;
* the **warp worklist** of §5.1: numWarps = ceil(max(#local, #remote) / dist); warp w owns local
  partitions [w*dist, (w+1)*dist) and remote partitions [w*dist, (w+1)*dist), processed as
  interleaved pairs (issue remote get k, aggregate local k, wait, aggregate remote k);
  numBlocks = ceil(numWarps / wpb) (shared memory per block: mgg.kernels.variants);
* the **halo**: the unique remote (PE, row) pairs, sorted by PE, and for every remote edge its
  slot in the halo (the CPU executor and the GPU halo variant fetch each unique row once).

Plans are plain dataclasses of numpy arrays; `save`/`load` write and read them as .npz
(atomically). One plan feeds the CPU executor and the GPU kernels alike.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

from ..atomic import atomic_write
from .partition import owner_of

__all__ = ["AggregationPlan", "build_plan", "cut_partitions", "cut_segments", "cut_remote",
           "warp_worklist",
           "PlanParams", "INT_BYTES", "FLOAT_BYTES"]

INT_BYTES = 4
FLOAT_BYTES = 4


@dataclass(frozen=True)
class PlanParams:
    """The three knobs of MGG: neighbor-partition size, interleave distance, warps per block."""

    ps: int = 16
    dist: int = 4
    wpb: int = 4
    ps_inter: int | None = None  # partition size for other-node remote neighbors (None: ps)

    def __post_init__(self) -> None:
        for name, lo, hi in (("ps", 1, 1024), ("dist", 1, 64), ("wpb", 1, 32), ("ps_inter", 1, 1024)):
            v = getattr(self, name)
            if name == "ps_inter" and v is None:
                continue
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not lo <= int(v) <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")

    @property
    def inter_ps(self) -> int:
        """The partition size used for remote neighbors on other nodes (MGG 4.1: smaller over IB)."""
        return self.ps if self.ps_inter is None else int(self.ps_inter)


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
    return cut_segments(indptr[:-1], indptr[1:], ps)


def cut_segments(starts: np.ndarray, ends: np.ndarray, ps: int) -> np.ndarray:
    """Cut segment i = [starts[i], ends[i]) (one per row i) into chunks of at most `ps` entries.

    Returns int64 [Q, 3] of (row, start, end) ordered by row; empty segments give no chunk.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    nparts = (ends - starts + ps - 1) // ps
    total = int(nparts.sum())
    if total == 0:
        return np.zeros((0, 3), dtype=np.int64)
    row = np.repeat(np.arange(len(starts), dtype=np.int64), nparts)
    k = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(nparts) - nparts, nparts)
    start = starts[row] + k * ps
    return np.stack([row, start, np.minimum(start + ps, ends[row])], axis=1)


def cut_remote(remote_indptr: np.ndarray, remote_split: np.ndarray, ps: int, ps_inter: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Node-aware cut of the remote CSR: in row i, entries [indptr[i], split[i]) have owners on
    this node (cut by `ps`), entries [split[i], indptr[i+1]) on other nodes (cut by `ps_inter`).

    Returns (parts int64 [Rp, 3] in CSR order, inter bool [Rp]).
    """
    same = cut_segments(remote_indptr[:-1], remote_split, ps)
    inter = cut_segments(remote_split, remote_indptr[1:], ps_inter)
    parts = np.concatenate([same, inter])
    flag = np.concatenate([np.zeros(len(same), bool), np.ones(len(inter), bool)])
    order = np.argsort(parts[:, 1], kind="stable")  # segments are disjoint: starts are unique
    return parts[order], flag[order]


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
    remote_split: np.ndarray    # int64 [n], row i's other-node entries are [remote_split[i], remote_indptr[i+1])
    remote_part_inter: np.ndarray  # bool [Rp], partition reads from another node
    node_of_pe: np.ndarray      # int32 [P], node index of every PE
    ps_inter: int = 0           # partition size of other-node remote partitions
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
        rp, inter = cut_remote(self.remote_indptr, self.remote_split, params.ps, params.inter_ps)
        return dataclasses.replace(self, ps=params.ps, dist=params.dist, wpb=params.wpb,
                                   ps_inter=params.inter_ps, local_parts=lp, remote_parts=rp,
                                   remote_part_inter=inter,
                                   warps=warp_worklist(len(lp), len(rp), params.dist))

    # -- serialisation ----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as .npz atomically (temp file in the same folder, then rename)."""
        arrays = {f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}
        atomic_write(path, lambda fh: np.savez(fh, **arrays))

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
        for k in ("rank", "world_size", "lo", "hi", "rows_per_pe", "ps", "dist", "wpb", "ps_inter"):
            kw[k] = int(kw[k])
        kw["has_self"] = bool(kw["has_self"])
        return cls(**kw)


def build_plan(row_indptr: np.ndarray, row_indices: np.ndarray, row_weight: np.ndarray,
               self_weight: np.ndarray | None, bounds: np.ndarray, rank: int,
               params: PlanParams = PlanParams(), node_of_pe: np.ndarray | None = None,
               *, device: str | torch.device | None = None) -> AggregationPlan:
    """Build rank `rank`'s plan from its rows of the weighted global CSR.

    Args:
        row_indptr: int64 [n + 1], the rank's CSR rows rebased so row_indptr[0] == 0.
        row_indices: int64 [E_r], GLOBAL source ids of those rows.
        row_weight: float [E_r], the weight of each entry.
        self_weight: float [n] diagonal weights, or None.
        bounds: int64 [P + 1] from `partition_ranges`.
        rank: this rank.
        params: ps, dist, wpb (and ps_inter for other-node remote neighbors).
        node_of_pe: int [P] node index of each PE (None: all on one node). Remote entries of a row
            are ordered same-node first, then other-node, each class cut by its own ps.
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
    node_of_pe = (np.zeros(world, np.int32) if node_of_pe is None
                  else np.asarray(node_of_pe, dtype=np.int32))
    if node_of_pe.shape != (world,):
        raise ValueError(f"build_plan: node_of_pe has shape {node_of_pe.shape}, expected ({world},)")
    split = _split_rows(row_indptr, row_indices, row_weight, bounds, rank, node_of_pe, device)
    (local_indptr, local_indices, local_weight, remote_indptr, remote_pe, remote_row, remote_weight,
     remote_split, halo_ptr, halo_row, remote_slot) = split

    lp = cut_partitions(local_indptr, params.ps)
    rp, rp_inter = cut_remote(remote_indptr, remote_split, params.ps, params.inter_ps)
    sw = np.zeros(n, dtype=np.float32) if self_weight is None else np.asarray(self_weight, np.float32)
    return AggregationPlan(
        rank=rank, world_size=world, lo=lo, hi=hi, rows_per_pe=rows_per_pe,
        ps=params.ps, dist=params.dist, wpb=params.wpb,
        local_indptr=local_indptr, local_indices=local_indices,
        local_weight=local_weight, remote_indptr=remote_indptr,
        remote_pe=remote_pe, remote_row=remote_row,
        remote_weight=remote_weight, self_weight=sw,
        local_parts=lp, remote_parts=rp, warps=warp_worklist(len(lp), len(rp), params.dist),
        halo_ptr=halo_ptr, halo_row=halo_row,
        remote_slot=remote_slot, remote_split=remote_split,
        remote_part_inter=rp_inter, node_of_pe=node_of_pe, ps_inter=params.inter_ps,
        has_self=self_weight is not None)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """int64 [len(x) + 1]: out[0] = 0, out[k + 1] = x[0] + ... + x[k]."""
    out = torch.zeros(x.numel() + 1, dtype=torch.int64, device=x.device)
    if x.numel():
        torch.cumsum(x, 0, out=out[1:])
    return out


def _tensor(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    """A tensor on `dev` sharing memory with `a` on the CPU (read-only arrays, e.g. memory maps,
    are shared too: the split never writes its inputs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": we only read it
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def _split_rows(row_indptr: np.ndarray, row_indices: np.ndarray, row_weight: np.ndarray,
                bounds: np.ndarray, rank: int, node_of_pe: np.ndarray,
                device: str | torch.device | None) -> tuple[np.ndarray, ...]:
    """The local/remote split of a rank's rows, the node-aware order of its remote entries and the
    halo, with scans and scatters only (no sort): O(E + n + span of the remote ids) on `device`.

    Returns numpy arrays (local_indptr, local_indices, local_weight, remote_indptr, remote_pe int32,
    remote_row, remote_weight, remote_split, halo_ptr, halo_row, remote_slot); see AggregationPlan.
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    world = len(bounds) - 1
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    n = hi - lo
    ip, idx, w, b_t = (_tensor(a, dev) for a in (row_indptr, row_indices, row_weight, bounds))
    is_local = (idx >= lo) & (idx < hi)
    # per-row counts from a scan of the mask: entries of row t are [ip[t], ip[t+1])
    cl = _exclusive_cumsum(is_local)[ip]
    local_indptr = cl - cl[0]
    remote_indptr = (ip - ip[0]) - local_indptr
    local_indices = idx[is_local] - lo
    local_weight = w[is_local]
    is_remote = ~is_local
    r_src = idx[is_remote]
    r_w = w[is_remote]
    er = r_src.numel()
    r_pe = torch.searchsorted(b_t, r_src, right=True) - 1
    nop = _tensor(node_of_pe.astype(np.int64), dev)
    same = nop[r_pe] == int(node_of_pe[rank]) if er else torch.zeros(0, dtype=torch.bool, device=dev)
    cs = _exclusive_cumsum(same)  # same-node entries before each remote entry
    same_per_row = cs[remote_indptr[1:]] - cs[remote_indptr[:-1]]
    remote_split = remote_indptr[:-1] + same_per_row
    if er and not bool(same.all()):
        # stable partition inside every row: same-node entries first, then other-node ones
        row = torch.repeat_interleave(torch.arange(n, device=dev), remote_indptr[1:] - remote_indptr[:-1],
                                      output_size=er)
        k = torch.arange(er, device=dev)
        before_same = cs[:-1] - cs[remote_indptr[row]]
        before_inter = (k - remote_indptr[row]) - before_same
        pos = torch.where(same, remote_indptr[row] + before_same, remote_split[row] + before_inter)
        order = torch.empty_like(pos)
        order[pos] = k
        r_src, r_w, r_pe = r_src[order], r_w[order], r_pe[order]
    remote_row = r_src - b_t[r_pe]
    # halo: the distinct remote ids in increasing order (= by (PE, row)) and each entry's slot,
    # from a presence map over the span of the remote ids
    if er:
        base = int(r_src.min())
        present = torch.zeros(int(r_src.max()) - base + 1, dtype=torch.bool, device=dev)
        present[r_src - base] = True
        slot_of = torch.cumsum(present, 0) - 1
        halo_ids = torch.nonzero(present).reshape(-1) + base
        remote_slot = slot_of[r_src - base]
    else:
        halo_ids = remote_slot = torch.zeros(0, dtype=torch.int64, device=dev)
    halo_pe = torch.searchsorted(b_t, halo_ids, right=True) - 1
    halo_ptr = _exclusive_cumsum(torch.bincount(halo_pe, minlength=world))
    halo_row = halo_ids - b_t[halo_pe]
    out = (local_indptr, local_indices, local_weight, remote_indptr, r_pe.to(torch.int32), remote_row,
           r_w, remote_split, halo_ptr, halo_row, remote_slot)
    return tuple(t.cpu().numpy() for t in out)
