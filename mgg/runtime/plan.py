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
from ..knobs import KNOB_DEFAULTS, KNOB_RANGES, check_knob
from .partition import owner_of
from .transfer import device_to_host

__all__ = ["AggregationPlan", "build_plan", "cut_partitions", "cut_segments", "cut_remote",
           "warp_worklist",
           "PlanParams"]

@dataclass(frozen=True)
class PlanParams:
    """The three knobs of MGG: neighbor-partition size, interleave distance, warps per block
    (defaults and ranges: mgg.knobs)."""

    ps: int = KNOB_DEFAULTS["ps"]
    dist: int = KNOB_DEFAULTS["dist"]
    wpb: int = KNOB_DEFAULTS["wpb"]
    ps_inter: int | None = None  # partition size for other-node remote neighbors (None: ps)

    def __post_init__(self) -> None:
        for name in KNOB_RANGES:
            if name == "ps_inter" and self.ps_inter is None:
                continue
            check_knob(name, getattr(self, name))

    @property
    def inter_ps(self) -> int:
        """The partition size used for remote neighbors on other nodes (MGG 4.1: smaller over IB)."""
        return self.ps if self.ps_inter is None else int(self.ps_inter)


def cut_partitions(indptr, ps: int):
    """Cut every CSR row into chunks of at most `ps` entries.

    Args:
        indptr: int64 [n + 1] (numpy array, or a tensor: the result is then a tensor on its device).
        ps: partition size >= 1.

    Returns:
        int64 [num_parts, 3] of (target row, start, end), ordered by target then start; rows with
        no entries get no partition.
    """
    ip = _as_t(indptr)
    out = _stack_parts(*_cut_t(ip[:-1], ip[1:], ps))
    return out if isinstance(indptr, torch.Tensor) else out.numpy()


def cut_segments(starts, ends, ps: int):
    """Cut segment i = [starts[i], ends[i]) (one per row i) into chunks of at most `ps` entries.

    Returns int64 [Q, 3] of (row, start, end) ordered by row; empty segments give no chunk
    (numpy in, numpy out; tensors in, a tensor on their device out).
    """
    out = _stack_parts(*_cut_t(_as_t(starts), _as_t(ends), ps))
    return out if isinstance(starts, torch.Tensor) else out.numpy()


def cut_remote(remote_indptr, remote_split, ps: int, ps_inter: int):
    """Node-aware cut of the remote CSR: in row i, entries [indptr[i], split[i]) have owners on
    this node (cut by `ps`), entries [split[i], indptr[i+1]) on other nodes (cut by `ps_inter`).

    Returns (parts int64 [Rp, 3] in CSR order, inter bool [Rp]) (numpy in, numpy out; tensors
    in, tensors on their device out).
    """
    parts, inter = _cut_remote_t(_as_t(remote_indptr), _as_t(remote_split), ps, ps_inter)
    if isinstance(remote_indptr, torch.Tensor):
        return parts, inter
    return parts.numpy(), inter.numpy()


def warp_worklist(num_local_parts: int, num_remote_parts: int, dist: int, device=None):
    """Warp-to-partition mapping of §5.1 (Eq. 2).

    Returns:
        int64 [numWarps, 4] of (local_begin, local_end, remote_begin, remote_end): warp w owns
        local partitions [local_begin, local_end) and remote ones [remote_begin, remote_end),
        `dist` of each (fewer at the tail); numWarps = ceil(max(local, remote) / dist). A numpy
        array, or a tensor on `device` when one is given.
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    out = _warps_t(num_local_parts, num_remote_parts, dist, dev)
    return out if device is not None else out.numpy()


# -- torch forms of the cuts (any device; the public functions above wrap them) -----------------
def _as_t(a) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.to(torch.int64)
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


def _stack_parts(row: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    return torch.stack([row, start, end], dim=1)


def _cut_t(starts: torch.Tensor, ends: torch.Tensor, ps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(segment, start, end) int64 [Q] of the chunks of at most `ps` (an int, or an int64 tensor
    with one size per segment) of segments [starts[i], ends[i]), ordered by segment then start."""
    dev = starts.device
    nparts = (ends - starts + ps - 1) // ps
    total = int(nparts.sum()) if nparts.numel() else 0
    if total == 0:
        z = torch.zeros(0, dtype=torch.int64, device=dev)
        return z, z, z
    seg = torch.repeat_interleave(torch.arange(nparts.numel(), device=dev), nparts, output_size=total)
    first = _exclusive_cumsum(nparts)
    k = torch.arange(total, device=dev) - first[seg]
    ps_seg = ps[seg] if isinstance(ps, torch.Tensor) else ps
    start = starts[seg] + k * ps_seg
    return seg, start, torch.minimum(start + ps_seg, ends[seg])


def _cut_remote_t(remote_indptr: torch.Tensor, remote_split: torch.Tensor, ps: int, ps_inter: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cut_remote on tensors: the 2n segments (same-node part of row i, other-node part of row i)
    interleaved, each cut by its class's size, are in CSR order by construction (no sort)."""
    dev = remote_indptr.device
    n = remote_indptr.numel() - 1
    starts = torch.stack([remote_indptr[:-1], remote_split], dim=1).reshape(-1)
    ends = torch.stack([remote_split, remote_indptr[1:]], dim=1).reshape(-1)
    ps_seg = torch.tensor([ps, ps_inter], dtype=torch.int64, device=dev).repeat(n)
    seg, start, end = _cut_t(starts, ends, ps_seg)
    return _stack_parts(seg // 2, start, end), (seg % 2) == 1


def _warps_t(num_local_parts: int, num_remote_parts: int, dist: int, dev: torch.device) -> torch.Tensor:
    num_warps = -(-max(num_local_parts, num_remote_parts) // dist)
    if not num_warps:
        return torch.zeros((0, 4), dtype=torch.int64, device=dev)
    w = torch.arange(num_warps, dtype=torch.int64, device=dev) * dist
    return torch.stack([w.clamp(max=num_local_parts), (w + dist).clamp(max=num_local_parts),
                        w.clamp(max=num_remote_parts), (w + dist).clamp(max=num_remote_parts)], dim=1)


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
    local_indices: np.ndarray   # int32 [El] (int64 from 2^31 rows), local source rows in [0, n)
    local_weight: np.ndarray    # float32 [El]
    remote_indptr: np.ndarray   # int64 [n + 1]
    remote_pe: np.ndarray       # int32 [Er], owner PE of each remote source
    remote_row: np.ndarray      # int32 [Er] (int64 from 2^31 rows), row of the source in the owner's slice
    remote_weight: np.ndarray   # float32 [Er]
    self_weight: np.ndarray     # float32 [n] (zeros when the kind has no self term)
    local_parts: np.ndarray     # int64 [Lp, 3] (target, start, end) into local_indices
    remote_parts: np.ndarray    # int64 [Rp, 3] (target, start, end) into remote_*
    warps: np.ndarray           # int64 [numWarps, 4] (lb, le, rb, re), see warp_worklist
    halo_ptr: np.ndarray        # int64 [P + 1], halo entries of PE p are [halo_ptr[p], halo_ptr[p+1])
    halo_row: np.ndarray        # int64 [H], row in the owner's slice, sorted within each PE
    remote_slot: np.ndarray     # int32 [Er] (int64 from 2^31 halo rows), index of each remote entry's row in the halo
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


def build_plan(row_indptr, row_indices, row_weight, self_weight, bounds: np.ndarray, rank: int,
               params: PlanParams = PlanParams(), node_of_pe: np.ndarray | None = None,
               *, device: str | torch.device | None = None) -> AggregationPlan:
    """Build rank `rank`'s plan from its rows of the weighted global CSR.

    Every step (split, node-aware order, halo, partition cuts, worklist) is a torch op sequence on
    `device` (None: CPU, with torch's intra-op threads); the finished arrays are moved to the
    host once, at the end (the plan holds numpy arrays).

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
        device: where to build. The row arrays may be numpy arrays or tensors (on any device).
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    bounds = np.asarray(bounds, dtype=np.int64)
    world = len(bounds) - 1
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    n = hi - lo
    ip = _to_dev(row_indptr, torch.int64, dev)
    idx = _to_dev(row_indices, torch.int64, dev)
    w = _to_dev(row_weight, torch.float32, dev)
    e_last = int(ip[-1]) if ip.numel() else -1
    if ip.numel() != n + 1 or e_last != idx.numel() or w.numel() != idx.numel():
        raise ValueError(f"build_plan: rank {rank} rows disagree: {ip.numel() - 1} rows for range "
                         f"[{lo}, {hi}), {idx.numel()} indices, {w.numel()} weights")
    rows_per_pe = max(1, int(np.diff(bounds).max()))
    node_of_pe = (np.zeros(world, np.int32) if node_of_pe is None
                  else np.asarray(node_of_pe, dtype=np.int32))
    if node_of_pe.shape != (world,):
        raise ValueError(f"build_plan: node_of_pe has shape {node_of_pe.shape}, expected ({world},)")
    split = _split_rows_t(ip, idx, w, bounds, rank, node_of_pe, dev)
    (local_indptr, local_indices, local_weight, remote_indptr, remote_pe, remote_row, remote_weight,
     remote_split, halo_ptr, halo_row, remote_slot) = split

    lp = _stack_parts(*_cut_t(local_indptr[:-1], local_indptr[1:], params.ps))
    rp, rp_inter = _cut_remote_t(remote_indptr, remote_split, params.ps, params.inter_ps)
    warps = _warps_t(int(lp.shape[0]), int(rp.shape[0]), params.dist, dev)
    sw = (torch.zeros(n, dtype=torch.float32, device=dev) if self_weight is None
          else _to_dev(self_weight, torch.float32, dev))
    arrays = dict(local_indptr=local_indptr, local_indices=local_indices,
                  local_weight=local_weight, remote_indptr=remote_indptr,
                  remote_pe=remote_pe, remote_row=remote_row,
                  remote_weight=remote_weight, self_weight=sw,
                  local_parts=lp, remote_parts=rp, warps=warps,
                  halo_ptr=halo_ptr, halo_row=halo_row,
                  remote_slot=remote_slot, remote_split=remote_split, remote_part_inter=rp_inter)
    # the per-entry row indices in 4 bytes where every row fits (the plan's largest arrays: half the
    # host memory and the device -> host bytes of int64)
    for key, rows in (("local_indices", n), ("remote_row", rows_per_pe), ("remote_slot", int(halo_row.numel()))):
        if rows < 2**31:
            arrays[key] = arrays[key].to(torch.int32)
    host = {k: _host(v) for k, v in arrays.items()}  # the one device -> host move
    return AggregationPlan(
        rank=rank, world_size=world, lo=lo, hi=hi, rows_per_pe=rows_per_pe,
        ps=params.ps, dist=params.dist, wpb=params.wpb, node_of_pe=node_of_pe,
        ps_inter=params.inter_ps, has_self=self_weight is not None, **host)


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


def _to_dev(a, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """`a` (numpy array or tensor) as a `dtype` tensor on `dev` (no copy when it already is one)."""
    if not isinstance(a, torch.Tensor):
        a = _tensor(np.asarray(a), torch.device("cpu"))
    return a.to(device=dev, dtype=dtype)


def _host(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's numpy view, or a device tensor copied to the host (staged, threaded:
    mgg.runtime.transfer)."""
    return device_to_host(t) if t.device.type != "cpu" else t.numpy()


def _split_rows_t(ip: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, bounds: np.ndarray,
                  rank: int, node_of_pe: np.ndarray, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """The local/remote split of a rank's rows, the node-aware order of its remote entries and the
    halo, with scans and scatters only (no sort): O(E + n + span of the remote ids) on `dev`.

    Returns tensors on `dev` (local_indptr, local_indices, local_weight, remote_indptr, remote_pe
    int32, remote_row, remote_weight, remote_split, halo_ptr, halo_row, remote_slot); see
    AggregationPlan.
    """
    world = len(bounds) - 1
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    n = hi - lo
    b_t = torch.from_numpy(bounds).to(dev)
    e = idx.numel()
    all_local = e == 0
    if e:
        mn, mx = torch.aminmax(idx)
        all_local = bool((mn >= lo) & (mx < hi))
    if all_local:  # every source is owned here (P = 1, or a closed range): no mask, no scan
        z = torch.zeros(0, dtype=torch.int64, device=dev)
        return (ip - ip[0], idx - lo, w.clone(), torch.zeros(n + 1, dtype=torch.int64, device=dev),
                torch.zeros(0, dtype=torch.int32, device=dev), z, torch.zeros(0, dtype=torch.float32, device=dev),
                torch.zeros(n, dtype=torch.int64, device=dev), torch.zeros(world + 1, dtype=torch.int64, device=dev),
                z, z)
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
    nop = torch.from_numpy(node_of_pe.astype(np.int64)).to(dev)
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
    return (local_indptr, local_indices, local_weight, remote_indptr, r_pe.to(torch.int32), remote_row,
            r_w, remote_split, halo_ptr, halo_row, remote_slot)
