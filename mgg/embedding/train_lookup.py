"""The training forward of a GPU-resident `MultiTableEmbeddingBag`: every table of a call at once.

A DLRM step looks up tens of tables with small batches, so its time is kernel launches, not
bytes. Here the number of launches does not grow with the number of tables (besides each
table's check launch and its input's conversions):

1. `route`: all tables' ids in one vector, each id's table parameters (rows, slice rows, base,
   key offset) gathered from small per-table vectors, so clamping and the (owner, local row, key)
   of every id are a handful of vector operations;
2. the batch's unique rows (sort, segment ids, a buffer of n + 1 slots: unused slots and the sink
   of ids after the last bag read zero rows) and ONE row-gather (`fetch`, the module's autograd
   node);
3. `pool`: tables of one width, mode and weighting pooled by ONE `F.embedding_bag` over the
   concatenated bags (each table's offsets shifted by its first id's position), split per table;
   the gradient of the gathered rows is torch's own (max mode, per-sample weights, mean). With
   `include_last_offset` a table pools on its own (its ids after offsets[-1] go to the sink slot).
   With `capturable` the groups pool with `mgg.embedding.capturable_pool.pool_bags` instead
   ("sum" and "mean": nothing read back to the host in forward or backward, so the step can be
   captured in a CUDA graph; equal to torch's to float rounding); "max" raises ValueError there.

Per-table vectors that depend only on the call's shape (the tables present, their id and bag
counts) are cached on the `RouteCache`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..kernels.embedding_gpu import TableGeometry
from .capturable_pool import pool_bags
from .device_input import DeviceBags

__all__ = ["RouteCache", "route", "unique_slots", "pool"]


@dataclass
class RouteCache:
    """Device vectors of a call's shape, kept across calls (the shape of a training loop's
    batches rarely changes): key -> tensor."""

    tensors: dict = field(default_factory=dict)
    max_entries: int = 64

    def get(self, key, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        t = self.tensors.get(key)
        if t is None:
            if len(self.tensors) >= self.max_entries:
                self.tensors.clear()
            t = self.tensors[key] = make()
        return t


def _per_id(cache: RouteCache, name: str, values: Sequence[int], counts: Sequence[int], device) -> torch.Tensor:
    """int64 [sum(counts)]: values[i] repeated counts[i] times, on `device` (cached by shape)."""
    key = (name, tuple(values), tuple(counts))
    n = int(sum(counts))

    def make():
        v = torch.tensor(list(values), dtype=torch.int64, device=device)
        r = torch.tensor(list(counts), dtype=torch.int64, device=device)
        return torch.repeat_interleave(v, r, output_size=n)
    return cache.get(key, make)


def route(geometry: Sequence[TableGeometry], key_offset: Sequence[int], bags: Sequence[DeviceBags | None],
          cache: RouteCache, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(key int64 [n], owner int64 [n], local int64 [n], the present tables) of every id of the
    present tables, in table order. Bad ids (the check launches report them) are clamped into
    [0, N_t) so that nothing reads out of bounds."""
    present = [t for t, b in enumerate(bags) if b is not None]
    counts = [int(bags[t].ids.numel()) for t in present]
    parts = [bags[t].ids.to(torch.int64) for t in present]
    ids = torch.cat(parts) if len(parts) > 1 else parts[0]
    if len(present) == 1:  # scalars: no per-id vectors
        g = geometry[present[0]]
        ids = ids.clamp(0, g.num_rows - 1)
        owner, local = _locate(ids, g.hash, g.world, g.slice_rows, g.base)
        return ids + int(key_offset[present[0]]), owner, local, present
    gs = [geometry[t] for t in present]
    last = _per_id(cache, "last", [g.num_rows - 1 for g in gs], counts, device)
    ids = torch.minimum(ids.clamp(min=0), last)
    base = _per_id(cache, "base", [g.base for g in gs], counts, device)
    hashed = [g.hash for g in gs]
    world = gs[0].world
    if not any(hashed):
        owner, local = _locate(ids, False, world, _per_id(cache, "slice", [g.slice_rows for g in gs], counts, device),
                               base)
    elif all(hashed):
        owner, local = _locate(ids, True, world, None, base)
    else:
        ro, rl = _locate(ids, False, world, _per_id(cache, "slice", [g.slice_rows for g in gs], counts, device), base)
        ho, hl = _locate(ids, True, world, None, base)
        is_hash = _per_id(cache, "hash", [int(h) for h in hashed], counts, device).bool()
        owner, local = torch.where(is_hash, ho, ro), torch.where(is_hash, hl, rl)
    key = ids + _per_id(cache, "koff", [int(key_offset[t]) for t in present], counts, device)
    return key, owner, local, present


def _locate(ids: torch.Tensor, hashed: bool, world: int, slice_rows, base) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner, local row) of ids (mgg.embedding.sharding.TableLayout.locate, vectorised over a
    scalar or per-id slice size and base)."""
    if hashed:
        return ids % world, ids // world + base
    owner = torch.div(ids, slice_rows, rounding_mode="floor")
    return owner, ids - owner * slice_rows + base


def unique_slots(key: torch.Tensor, owner: torch.Tensor, local: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unique rows without reading anything back: (inv int64 [n]: each id's slot; slot_key
    int64 [n + 1], slot_owner int32 [n + 1], slot_local int64 [n + 1]). Slots past the last
    unique key and slot n (the sink) keep key -1 and owner -1 (they read zero rows)."""
    n = int(key.numel())
    dev = key.device
    sk, perm = torch.sort(key)
    seg = torch.zeros(n, dtype=torch.int64, device=dev)
    if n > 1:
        seg[1:] = torch.cumsum(sk[1:] != sk[:-1], 0)
    inv = torch.empty_like(seg).scatter_(0, perm, seg)
    slot_key = torch.full((n + 1,), -1, dtype=torch.int64, device=dev).scatter_(0, seg, sk)
    slot_owner = torch.full((n + 1,), -1, dtype=torch.int32, device=dev).scatter_(0, seg, owner[perm].to(torch.int32))
    slot_local = torch.zeros(n + 1, dtype=torch.int64, device=dev).scatter_(0, seg, local[perm])
    return inv, slot_key, slot_owner, slot_local


def _bag_offsets(b: DeviceBags, device) -> torch.Tensor:
    """int64 [num_bags]: each bag's first id (2-D input: bags of bag_size ids)."""
    if b.offsets is None:
        return torch.arange(b.num_bags, dtype=torch.int64, device=device) * b.bag_size
    return b.offsets.to(torch.int64)[: b.num_bags]


def pool(rows: torch.Tensor, inv: torch.Tensor, bags: Sequence[DeviceBags | None], geometry: Sequence[TableGeometry],
         present: Sequence[int], include_last_offset: bool, cache: RouteCache,
         capturable: bool = False) -> list[torch.Tensor | None]:
    """Pooled bags [B_t, D_t] of every present table (None elsewhere) from the gathered slot rows
    `rows` [n + 1, Dmax] and each id's slot `inv` [n] (ids in table order). capturable: pool
    with `pool_bags` (no host read; "sum" and "mean" only) instead of F.embedding_bag."""
    dev = rows.device
    outs: list[torch.Tensor | None] = [None] * len(bags)
    start, pos = {}, 0
    for t in present:
        start[t] = pos
        pos += int(bags[t].ids.numel())
    sink = int(inv.numel())
    groups: dict[tuple, list[int]] = {}
    for t in present:
        b, g = bags[t], geometry[t]
        if include_last_offset and b.offsets is not None:
            outs[t] = _pool_alone(rows, inv, b, g, start[t], sink, capturable)
        else:
            groups.setdefault((g.dim, g.mode, b.per_sample_weights is not None), []).append(t)
    for (dim, mode, weighted), ts in groups.items():
        w = rows if dim == rows.shape[1] else rows[:, :dim]
        contiguous = all(start[ts[i + 1]] == start[ts[i]] + int(bags[ts[i]].ids.numel()) for i in range(len(ts) - 1))
        lo = start[ts[0]]
        hi = start[ts[-1]] + int(bags[ts[-1]].ids.numel())
        inv_g = inv[lo:hi] if contiguous else torch.cat([inv[start[t]: start[t] + int(bags[t].ids.numel())] for t in ts])
        firsts, p = [], 0
        for t in ts:
            firsts.append(p)
            p += int(bags[t].ids.numel())
        nb = [bags[t].num_bags for t in ts]
        offs = [_bag_offsets(bags[t], dev) for t in ts]
        off = torch.cat(offs) if len(offs) > 1 else offs[0]
        if len(ts) > 1:
            off = off + _per_id(cache, "first", firsts, nb, dev)
        psw = None
        if weighted:
            ws = [bags[t].per_sample_weights for t in ts]
            psw = (torch.cat(ws) if len(ws) > 1 else ws[0]).to(w.dtype)
        if capturable:
            pooled = pool_bags(w, inv_g, off, mode, psw)
        else:
            pooled = F.embedding_bag(inv_g, w, off, mode=mode, per_sample_weights=psw)
        for t, o in zip(ts, torch.split(pooled, nb)):
            outs[t] = o
    return outs


def _pool_alone(rows, inv, b: DeviceBags, g: TableGeometry, first: int, sink: int,
                capturable: bool = False) -> torch.Tensor:
    """One table with include_last_offset: its ids after offsets[-1] point at the sink slot (a zero
    row whose gradient is dropped; torch would leave theirs uninitialised with per-sample weights)."""
    k = int(b.ids.numel())
    w = rows if g.dim == rows.shape[1] else rows[:, : g.dim]
    inv_t = inv[first: first + k]
    off = b.offsets.to(torch.int64)
    if k:
        inside = torch.arange(k, device=rows.device) < off[-1]
        inv_t = torch.where(inside, inv_t, sink)
    if capturable:
        return pool_bags(w, inv_t, off, g.mode, b.per_sample_weights, include_last_offset=True)
    return F.embedding_bag(inv_t, w, off, mode=g.mode, per_sample_weights=b.per_sample_weights,
                           include_last_offset=True)
