"""The forward of a sharded embedding module whose table lives on the GPU (NVSHMEM store).

Inference (`eval()` or no grad), per table present in the call: ONE launch of emb_bag_lookup
(mgg/kernels/embedding_bag.cu), which reads the ids and offsets as the caller gave them, checks
them, routes every id to its owner PE and local row, reads the rows (own rows from local memory,
other PEs' through nvshmem_ptr loads) and pools them into the output. Nothing is read back on the
way and there is no barrier: the table changes only in an optimizer step, which publishes.

Training with grad: one check-only launch per table, then every table at once
(mgg.embedding.train_lookup): the ids routed as one vector, the batch's unique rows without a
host round trip (sort, segment ids, a buffer of n + 1 slots, unused slots zero rows of owner -1),
one row-gather launch, and one torch embedding_bag per group of tables of one width and mode over
the gathered rows, so the max-mode, per-sample-weight and mean gradients are torch's own; the rows'
gradient goes to the module (`reduce_gradients` drops the unused slots). With
`module.capturable_pooling` the pooling is mgg.embedding.capturable_pool's instead, and with checks
"deferred" nothing in the call reads the host: it can be captured in a CUDA graph.

Checks (`module.checks`, see mgg.embedding.device_input.CHECKS): with "sync" a call ends with one
device-to-host copy of the tables' status records and one synchronisation, and bad input raises
the error `check_bag_input` raises, before anything is returned; with "deferred" a call never
synchronises and `raise_input_errors()` raises what was recorded.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..kernels.embedding_gpu import (DECREASING_BIT, FIRST_OFFSET_BIT, ID_RANGE_BIT, LAST_OFFSET_BIT, ST_DEC,
                                     ST_FIRST, ST_FLAGS, ST_HI, ST_LAST, ST_LO, ST_REMOTE, ST_ROWS, STATUS_SLOTS,
                                     TableGeometry, clear_status_errors, lookup_bags, new_status, table_view)
from .device_input import DeviceBags, device_bag_input
from .lookup_counters import LookupCounters
from .train_lookup import RouteCache, pool, route, unique_slots
from .validate import check_bag_input

__all__ = ["GpuLookup"]

#: kernel launches of a training call besides each table's check and input conversions (about:
#: routing, unique slots, the row gather, one pooling per group)
_TRAIN_LAUNCHES = 24


class GpuLookup:
    """The GPU forward of one `MultiTableEmbeddingBag` (`module`): its tables' geometry, their
    status records on the GPU (int64 [T, STATUS_SLOTS]) and a pinned host copy, and the counters."""

    def __init__(self, module):
        self.module = module
        self.table = table_view(module.array)  # checked once; the array lives as long as the module
        self.device = self.table.device
        lay = module.layout
        self.geometry = [TableGeometry(int(cfg.num_embeddings), lay.slice_rows(t), int(lay.base[t]),
                                       cfg.sharding == "hash", lay.world, int(cfg.embedding_dim), cfg.mode)
                         for t, cfg in enumerate(module.tables)]
        self.status = new_status(len(module.tables), self.device)
        self.status_host = torch.empty((len(module.tables), STATUS_SLOTS), dtype=torch.int64, pin_memory=True)
        self.counters = LookupCounters()
        self.route_cache = RouteCache()  # the training path's per-shape vectors
        #: bytes the kernels read per row: whole 16-byte vectors of the table's width
        self.row_bytes = [16 * ((g.dim + 3) // 4) for g in self.geometry]

    # -- input --------------------------------------------------------------------------------
    def _bags(self, indices, offsets, psws) -> list[DeviceBags | None]:
        m = self.module
        if m.array is None:
            raise RuntimeError("the embedding module was freed")
        bags: list[DeviceBags | None] = []
        for t, cfg in enumerate(m.tables):
            if indices[t] is None:
                bags.append(None)
                continue
            b = device_bag_input(indices[t], offsets[t], psws[t], mode=cfg.mode, include_last_offset=m.include_last_offset,
                                 device=self.device, what=_what(cfg, t))
            self.counters.h2d_copies += b.copies
            self.counters.launches += b.conversions
            bags.append(b)
        return bags

    def _launch(self, t: int, b: DeviceBags, out: torch.Tensor | None) -> None:
        lookup_bags(self.table, self.geometry[t], b.ids, b.offsets, b.bag_size, b.num_bags,
                    b.per_sample_weights, self.status[t], out)
        if b.ids.numel() or b.num_bags:
            self.counters.launches += 1

    # -- inference ------------------------------------------------------------------------------
    def forward_pooled(self, indices, offsets, psws) -> list[torch.Tensor | None]:
        """Pooled bags of every table, one emb_bag_lookup launch per table."""
        bags = self._bags(indices, offsets, psws)
        outs: list[torch.Tensor | None] = []
        for t, b in enumerate(bags):
            if b is None:
                outs.append(None)
                continue
            out = torch.empty((b.num_bags, self.geometry[t].dim), dtype=torch.float32, device=self.device)
            self._launch(t, b, out)
            outs.append(out)
        self._finish(bags)
        return outs

    # -- training -------------------------------------------------------------------------------
    def forward_train(self, indices, offsets, psws, fetch) -> list[torch.Tensor | None]:
        """Pooled bags with autograd: `fetch(keys, owner, local)` gathers the unique rows as an
        autograd node (the module's). Every table of the call at once (mgg.embedding.train_lookup)."""
        m, c = self.module, self.counters
        bags = self._bags(indices, offsets, psws)
        present = [t for t, b in enumerate(bags) if b is not None]
        for t in present:
            self._launch(t, bags[t], None)  # checks only: the record says what was wrong
        if not present:
            self._finish(bags)
            return [None] * len(bags)
        key, owner, local, _ = route(self.geometry, m.layout.table_offset, bags, self.route_cache, self.device)
        inv, slot_key, slot_owner, slot_local = unique_slots(key, owner, local)
        rows = fetch(slot_key, slot_owner, slot_local)
        outs = pool(rows, inv, bags, self.geometry, present, m.include_last_offset, self.route_cache,
                    capturable=m.capturable_pooling)
        c.launches += _TRAIN_LAUNCHES + 3 * len(present)  # the routing, unique slots, gather and pooling
        self._finish(bags)
        return outs

    # -- checks ---------------------------------------------------------------------------------
    def _finish(self, bags: Sequence[DeviceBags | None]) -> None:
        c = self.counters
        c.calls += 1
        if self.module.checks == "deferred":
            return
        self._read_status()
        flags = self.status_host[:, ST_FLAGS]
        if not bool(flags.any()):
            return
        m = self.module
        try:
            for t, b in enumerate(bags):  # the exact error the host-side checks give
                if b is not None and int(flags[t]):
                    cfg = m.tables[t]
                    check_bag_input(*b.source, num_embeddings=cfg.num_embeddings, mode=cfg.mode,
                                    include_last_offset=m.include_last_offset, what=_what(cfg, t))
            self._raise_recorded()  # recorded by an earlier call in "deferred" mode
        finally:
            clear_status_errors(self.status)

    def _read_status(self) -> None:
        self.status_host.copy_(self.status, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        self.counters.d2h_copies += 1
        self.counters.host_syncs += 1

    def _raise_recorded(self) -> None:
        m = self.module
        for t, rec in enumerate(self.status_host.tolist()):
            f, what = rec[ST_FLAGS], _what(m.tables[t], t)
            if f & FIRST_OFFSET_BIT:
                raise ValueError(f"{what}: offsets must start at 0, got offsets[0]={rec[ST_FIRST]}")
            if f & DECREASING_BIT:
                i = rec[ST_DEC]
                raise ValueError(f"{what}: offsets must be non-decreasing; offsets[{i}] < offsets[{i - 1}]")
            if f & LAST_OFFSET_BIT:
                raise ValueError(f"{what}: offsets[-1]={rec[ST_LAST]} exceeds len(indices)")
            if f & ID_RANGE_BIT:
                bad = rec[ST_LO] if rec[ST_LO] < 0 else rec[ST_HI]
                raise IndexError(f"{what}: index {bad} out of range [0, {m.tables[t].num_embeddings})")

    def error_flag(self) -> torch.Tensor:
        """float32 0-d on the GPU, 1 when a table's status record holds an input error, else 0
        (nothing read on the host: a captured step reads it)."""
        return (self.status[:, ST_FLAGS] != 0).any().to(torch.float32)

    def raise_input_errors(self) -> None:
        """Raise the first error recorded since the last check (one synchronisation), and clear it."""
        self._read_status()
        try:
            self._raise_recorded()
        finally:
            if bool(self.status_host[:, ST_FLAGS].any()):
                clear_status_errors(self.status)

    def rows_read(self) -> tuple[int, int, int]:
        """(rows read, rows read from other PEs, bytes read from other PEs) by the lookup kernels
        since the module was made, all tables (one synchronisation)."""
        self._read_status()
        rows = self.status_host[:, ST_ROWS].tolist()
        remote = self.status_host[:, ST_REMOTE].tolist()
        return sum(rows), sum(remote), sum(r * b for r, b in zip(remote, self.row_bytes))


def _what(cfg, t: int) -> str:
    return f"table {cfg.name or t}"
