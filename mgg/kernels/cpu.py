"""CPU executor of an AggregationPlan: the same partitions and worklist semantics the GPU kernels
run, vectorised with torch.

Per neighbor partition (target, start, end) the GPU kernels compute a partial sum in one warp and
add it to the target's output row (atomics); here one chunk of partitions at a time does the same
with two index_adds: edges -> partition partial sums -> target rows. Remote partitions read their
neighbor rows from the halo buffer, which holds every unique remote row once, fetched through the
symmetric store before the remote partitions run.

Storage dtype: the rows are read from what the symmetric array holds. With a 16-bit array
(bfloat16 / float16, `RuntimeConfig.storage_dtype`) x is rounded once when written to the store;
local rows, halo rows and the self term all read those 16-bit values, each gathered chunk is
upcast to float32 before it is weighted and summed, and the output is float32 (docs/storage-dtype.md).
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.plan import AggregationPlan

__all__ = ["PartitionedAggregator", "CPUExecutor"]


class PartitionedAggregator:
    """Aggregates one CSR (local or remote half of a plan) partition by partition.

    Args:
        parts: int64 [Q, 3] (target, start, end) neighbor partitions covering [0, E) in order.
        sources: int64 [E], the row of `table` each entry reads (local id or halo slot).
        weight: float32 [E].
        chunk_edges: edges processed per vectorised step (bounds the [chunk, D] temporaries).
    """

    def __init__(self, parts: np.ndarray, sources: np.ndarray, weight: np.ndarray,
                 chunk_edges: int = 1 << 21):
        self.num_parts = int(parts.shape[0])
        sizes = (parts[:, 2] - parts[:, 1]) if self.num_parts else np.zeros(0, np.int64)
        self.target = torch.from_numpy(np.ascontiguousarray(parts[:, 0]))
        self.part_of_edge = torch.from_numpy(np.repeat(np.arange(self.num_parts, dtype=np.int64), sizes))
        self.sources = torch.from_numpy(np.ascontiguousarray(sources, dtype=np.int64))
        self.weight = torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32))
        # chunk boundaries on partition indices, each covering <= chunk_edges edges (>= 1 part)
        ends = parts[:, 2] if self.num_parts else np.zeros(0, np.int64)
        bounds = [0]
        while bounds[-1] < self.num_parts:
            a = bounds[-1]
            limit = (parts[a, 1] if self.num_parts else 0) + chunk_edges
            b = int(np.searchsorted(ends, limit, side="right"))
            bounds.append(max(b, a + 1))
        self.chunks = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
        self.starts = parts[:, 1] if self.num_parts else np.zeros(0, np.int64)
        self.ends = ends

    def add_into(self, out: torch.Tensor, table: torch.Tensor) -> None:
        """out[target] += sum over partitions of weight * table[sources], in out's dtype.

        table: [rows, D] of any float dtype (a 16-bit table is gathered in 16 bits, then each
        gathered chunk upcast to out.dtype before weighting and summing); out: float [n, D]."""
        acc = out.dtype
        for a, b in self.chunks:
            s, e = int(self.starts[a]), int(self.ends[b - 1])
            rows = table.index_select(0, self.sources[s:e])
            if rows.dtype != acc:
                rows = rows.to(acc)
            rows.mul_(self.weight[s:e].to(acc).unsqueeze(1))
            partial = torch.zeros((b - a, table.shape[1]), dtype=acc)
            partial.index_add_(0, self.part_of_edge[s:e] - a, rows)
            out.index_add_(0, self.target[a:b], partial)


class CPUExecutor:
    """Runs `out = W x + diag * x` for one plan on CPU, fetching remote rows through a store."""

    def __init__(self, plan: AggregationPlan):
        self.plan = plan
        self.local = PartitionedAggregator(plan.local_parts, plan.local_indices, plan.local_weight)
        self.remote = PartitionedAggregator(plan.remote_parts, plan.remote_slot, plan.remote_weight)
        self.self_weight = torch.from_numpy(plan.self_weight).unsqueeze(1) if plan.has_self else None

    def __call__(self, x: torch.Tensor, sym) -> torch.Tensor:
        """x: float32 [n_local, D] (this rank's rows); sym: a SymmetricArray [rows_per_pe, D] of
        x's dtype, or of a 16-bit storage dtype (then every row read is x rounded to it).

        Collective (every rank calls it with its own x). Returns [n_local, D] in x's dtype.
        """
        plan = self.plan
        x = x.detach().contiguous()
        sym.write(x)
        sym.publish()
        halo = sym.get_halo(plan.halo_ptr, plan.halo_row)  # each unique remote row once
        sym.release()
        # local rows as stored: x itself, or my 16-bit slice (what other ranks read of my rows);
        # publish/release do not touch my own slice, and it is only rewritten by the next write
        table = x if sym.dtype == x.dtype else sym.local[: plan.n_local]
        out = torch.zeros((plan.n_local, x.shape[1]), dtype=x.dtype)
        self.local.add_into(out, table)
        self.remote.add_into(out, halo)
        if self.self_weight is not None:
            out.addcmul_(self.self_weight.to(x.dtype), table.to(x.dtype))
        return out
