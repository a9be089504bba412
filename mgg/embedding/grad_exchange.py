"""Row gradients to their owners on the GPU: no gradient crosses the host.

The NVSHMEM store's training path keeps, per forward, each unique slot's (owner PE, local row)
and its gradient on the device. `DeviceGradExchange.exchange` moves them to the owners:

1. `pack_by_owner`: the valid slots (owner >= 0) are laid out by owner in fixed-capacity regions,
   send_rows int64 [P * C] (-1 in unused places) and send_vals [P * C, D];
2. two NVSHMEM on-stream all-to-alls (rows, values) over symmetric buffers of that shape, so
   region q of PE r lands in region r of PE q;
3. `sum_received`: the owner sorts what it received by local row (stable: ties keep the order
   source PE, then position) and sums each row's run with `torch.segment_reduce`, a fixed order,
   so the summed gradient is the same bit for bit from run to run.

The capacity C is the largest count any PE sends to any one PE in this call (one
synchronisation for the counts and one host all-reduce of the maximum), rounded up to a power of
two; the buffers grow to it collectively and are kept. A barrier on the stream precedes the
all-to-alls, so a PE that has not yet consumed the previous call's buffers is never overwritten.

At P = 1 nothing is exchanged: the slots are summed by row in place (`sum_received`).

The fixed-shape path (`exchange_fixed`, `sum_received_fixed`) reads nothing back to the host, so a
training step replayed from a CUDA graph can run it. Its capacity is reserved once, collectively,
outside the graph (`reserve_fixed`: the largest slot count of any PE, an upper bound of what it
sends to one PE), in buffers of their own that the per-call path never frees. It holds when every
PE sends a given row at most once (the slots of one forward are unique keys), so a row has at
most P contributions: they are placed in a dense [m + 1, P, D] buffer by (row's segment, source
order) and added over the P axis in a fixed order. Its result keeps its shape: rows with -1
where nothing, and the optimizers update under a mask (mgg.embedding.optim).
"""
from __future__ import annotations

import torch

__all__ = ["pack_by_owner", "sum_received", "sum_received_fixed", "DeviceGradExchange", "MIN_CAPACITY"]

#: the smallest per-pair capacity the buffers are allocated with (rows)
MIN_CAPACITY = 1024


def pack_by_owner(owner: torch.Tensor, local: torch.Tensor, values: torch.Tensor, world: int,
                  capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots laid out by owner PE in regions of `capacity` rows.

    owner: int [n] (-1: unused slot, dropped); local: int64 [n] local rows; values: float [n, D].
    Every owner's count must be <= capacity. Returns (rows int64 [world * capacity], -1 where
    nothing; vals [world * capacity, D], zeros where nothing), on values' device; region q holds
    owner q's slots in their input order."""
    n, d = int(owner.numel()), int(values.shape[1])
    dev = values.device
    m = world * capacity
    # one row past the end (the sink) takes the unused slots and is dropped by the slice
    rows = torch.full((m + 1,), -1, dtype=torch.int64, device=dev)
    vals = torch.zeros((m + 1, d), dtype=values.dtype, device=dev)
    if n:
        own = owner.to(torch.int64)
        key = torch.where(own >= 0, own, torch.full_like(own, world))  # unused slots sort last
        order = torch.sort(key, stable=True).indices
        sk = key[order]
        # counts by owner without bincount (which synchronises on CUDA): a scatter-add of ones
        counts = torch.zeros(world + 1, dtype=torch.int64, device=dev).index_add_(0, sk, torch.ones_like(sk))
        start = torch.cumsum(counts, 0) - counts  # first sorted position of each owner
        pos = torch.arange(n, device=dev) - start[sk]
        slot = torch.where(sk < world, sk * capacity + pos, torch.full_like(sk, m))
        rows[slot] = local.to(torch.int64)[order]
        vals[slot] = values[order]
    return rows[:m], vals[:m]


def sum_received(rows: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of each distinct row: rows int64 [m] (-1: nothing) and vals [m, D] ->
    (unique rows int64 [k], ascending; sums [k, D]). Each row's entries are added in their input
    order (a stable sort, then one segment sum a row): deterministic."""
    sk, perm = torch.sort(rows, stable=True)
    uniq, counts = torch.unique_consecutive(sk, return_counts=True)
    if uniq.numel() and int(uniq[0]) < 0:  # the unused places
        skip = int(counts[0])
        uniq, counts, perm = uniq[1:], counts[1:], perm[skip:]
    if not uniq.numel():
        return uniq, vals.new_zeros((0, vals.shape[1]))
    sums = torch.segment_reduce(vals[perm], "sum", lengths=counts, axis=0)
    return uniq, sums


def sum_received_fixed(rows: torch.Tensor, vals: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`sum_received` with a fixed shape and no host read: rows int64 [m] (-1: nothing) and vals
    [m, D], where a row occurs at most `world` times -> (rows int64 [m]: the distinct rows
    ascending, then -1; sums [m, D], zeros where the row is -1).

    Rows sorted stably; a segment a distinct row (the cumsum of "new row" flags), an entry's
    position in its segment (its index minus the cummax of the segment starts); the entries
    written to a dense [m + 1, world, D] buffer at (segment, position), the unused rows into the
    sink segment m (dropped), and the P positions added in order 0, 1, .., P - 1: each row's
    entries in their input order, as `sum_received` adds them, the same bits every call."""
    m, d = int(rows.numel()), int(vals.shape[1])
    dev = rows.device
    out_rows = torch.full((m + 1,), -1, dtype=torch.int64, device=dev)
    dense = torch.zeros(((m + 1) * world, d), dtype=vals.dtype, device=dev)
    if m:
        sk, perm = torch.sort(rows, stable=True)
        valid = sk >= 0  # the unused rows (-1) sort first
        new = torch.ones(m, dtype=torch.bool, device=dev)
        new[1:] = sk[1:] != sk[:-1]
        seg = torch.cumsum(new & valid, 0) - 1
        idx = torch.arange(m, device=dev)
        first = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), 0).values
        seg = torch.where(valid, seg, torch.full_like(seg, m))  # the unused rows: the sink segment
        pos = torch.where(valid, (idx - first).clamp(max=world - 1), torch.zeros_like(idx))
        out_rows.scatter_(0, seg, torch.where(valid, sk, torch.full_like(sk, -1)))
        dense[seg * world + pos] = vals[perm]
    dense = dense.view(m + 1, world, d)[:m]
    sums = dense[:, 0].clone()
    for p in range(1, world):
        sums += dense[:, p]
    return out_rows[:m], sums


class DeviceGradExchange:
    """The all-to-all of row gradients over an NVSHMEM store (see the module docstring).

    store: the module's NvshmemStore; world: P; dim: the row width D; dtype: the gradient dtype
    (float32 or float64)."""

    def __init__(self, store, world: int, dim: int, dtype: torch.dtype):
        self.store, self.world, self.dim, self.dtype = store, int(world), int(dim), dtype
        self.capacity = 0
        self._bufs = None  # (send_rows, recv_rows, send_vals, recv_vals), symmetric
        self.fixed_capacity = 0
        self._fixed = None  # the fixed-shape path's own buffers (a CUDA graph may hold them)

    def _alloc(self, capacity: int) -> tuple:
        """Collective: symmetric (send_rows, recv_rows, send_vals, recv_vals) of `capacity` rows a pair."""
        import nvshmem.core as nvshmem

        n = self.world * capacity
        return (nvshmem.tensor((n,), dtype=torch.int64), nvshmem.tensor((n,), dtype=torch.int64),
                nvshmem.tensor((n, self.dim), dtype=self.dtype), nvshmem.tensor((n, self.dim), dtype=self.dtype))

    def _replace(self, old: tuple | None, capacity: int) -> tuple:
        """Collective: free `old` buffers (None: none) and allocate them anew for `capacity` rows a
        pair, with no NVSHMEM work in flight on any PE around the host-side collectives."""
        import nvshmem.core as nvshmem

        self.store.quiesce()
        for b in old or ():
            nvshmem.free_tensor(b)
        new = self._alloc(capacity)
        self.store.quiesce()
        return new

    def _grow(self, capacity: int) -> None:
        """Collective: symmetric buffers for `capacity` rows a pair (every PE the same)."""
        old, self._bufs = self._bufs, None
        self._bufs = self._replace(old, capacity)
        self.capacity = capacity

    def _all_to_all(self, bufs: tuple, rows: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows / vals (laid out by `pack_by_owner` for these buffers) into the send buffers, then
        on the current stream a barrier (every PE done with the previous call's buffers) and the
        two all-to-alls; returns the receive buffers (rows, values)."""
        import nvshmem.core as nvshmem

        from ..runtime.stream_ref import StreamRef

        send_rows, recv_rows, send_vals, recv_vals = bufs
        send_rows.copy_(rows)
        send_vals.copy_(vals)
        stream = StreamRef(torch.cuda.current_stream().cuda_stream)
        nvshmem.barrier_all(stream=stream)
        team = nvshmem.Teams.TEAM_WORLD
        nvshmem.alltoall(team, recv_rows, send_rows, stream=stream)
        nvshmem.alltoall(team, recv_vals, send_vals, stream=stream)
        return recv_rows, recv_vals

    def reserve_fixed(self, slots: int) -> int:
        """Collective, outside any CUDA graph: buffers for the fixed-shape path that hold `slots`
        slots of every PE (the largest count over the PEs, agreed by one host all-reduce); kept
        until `free`, never reallocated smaller. Returns the capacity a pair."""
        need = int(self.store.comm.allreduce_scalar(int(slots), op="max"))
        if need > self.fixed_capacity:
            cap = max(MIN_CAPACITY, 1 << (max(need, 1) - 1).bit_length())
            old, self._fixed = self._fixed, None
            self._fixed = self._replace(old, cap)
            self.fixed_capacity = cap
        return self.fixed_capacity

    def exchange_fixed(self, owner: torch.Tensor, local: torch.Tensor, values: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Collective, no host read (capturable): the slots of ONE forward (unique keys; owner int
        [n], -1 unused; local int64 [n]; values [n, D]), n <= the reserved capacity, to their
        owners. Returns (rows int64 [P * C], -1 where nothing; sums [P * C, D]) on this GPU."""
        if self._fixed is None or int(owner.numel()) > self.fixed_capacity:
            raise RuntimeError(f"the fixed gradient exchange holds {self.fixed_capacity} slots a PE, got "
                               f"{int(owner.numel())}: call reserve_fixed first (collective)")
        rows, vals = pack_by_owner(owner.to(torch.int64), local, values.to(self.dtype), self.world,
                                   self.fixed_capacity)
        return sum_received_fixed(*self._all_to_all(self._fixed, rows, vals), self.world)

    def exchange(self, owner: torch.Tensor, local: torch.Tensor, values: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Collective: every PE's slots (owner int [n], -1 unused; local int64 [n]; values [n, D]
        on this GPU) to their owners. Returns (my rows int64 [k], ascending and unique; their
        summed gradients [k, D]) on this GPU."""
        own = owner.to(torch.int64)
        counts = torch.bincount(own[own >= 0], minlength=self.world)
        need = int(counts.max()) if counts.numel() else 0
        need = int(self.store.comm.allreduce_scalar(need, op="max"))
        if need > self.capacity:
            cap = max(MIN_CAPACITY, 1 << (need - 1).bit_length())
            self._grow(cap)
        rows, vals = pack_by_owner(own, local, values.to(self.dtype), self.world, self.capacity)
        recv_rows, recv_vals = self._all_to_all(self._bufs, rows, vals)
        # sum_received reads the buffers into new tensors on this stream, ahead of the next call's
        # barrier and all-to-alls: nothing it returns aliases them
        return sum_received(recv_rows, recv_vals)

    def free(self) -> None:
        """Collective: release the buffers (both paths')."""
        if self._bufs is not None or self._fixed is not None:
            import nvshmem.core as nvshmem

            self.store.quiesce()
            for b in (self._bufs or ()) + (self._fixed or ()):
                nvshmem.free_tensor(b)
            self._bufs, self.capacity = None, 0
            self._fixed, self.fixed_capacity = None, 0
