"""CPU executor of an AggregationPlan: the same partitions and worklist semantics the GPU kernels
run, vectorised with torch.

Per neighbor partition (target, start, end) the GPU kernels compute a partial sum in one warp and
add it to the target's output row (atomics); here every edge of the partitions, (target, source,
weight), is folded once into a sparse CSR matrix and each aggregation is one torch sparse x dense
product (MKL's multithreaded SpMM in torch's CPU builds: 4-5x faster per epoch than the earlier
index_select + index_add_ passes per chunk of partitions, which ran single-threaded). Remote
partitions read their neighbor rows from the halo buffer, which holds every unique remote row
once, fetched through the symmetric store before the remote partitions run.

Storage dtype: the rows are read from what the symmetric array holds. With a 16-bit array
(bfloat16 / float16, `RuntimeConfig.storage_dtype`) x is rounded once when written to the store;
local rows, halo rows and the self term all read those 16-bit values, upcast to float32 before
they are weighted and summed, and the output is float32 (docs/storage-dtype.md).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ..runtime.plan import AggregationPlan

__all__ = ["PartitionedAggregator", "CPUExecutor"]


class PartitionedAggregator:
    """Aggregates one CSR (local or remote half of a plan): out[target] += sum over its neighbor
    partitions of weight * table[sources].

    The partitions (target, start, end) say which target row each edge adds to. Every edge's
    (target, source, weight) is folded once into a sparse CSR matrix M [n_out, rows] (duplicate
    pairs summed), and each call is one torch sparse x dense product, out += M @ table (MKL's
    multithreaded SpMM in torch's CPU builds). Values equal the partition-by-partition sums up to float
    summation order.

    Args:
        parts: int64 [Q, 3] (target, start, end) neighbor partitions covering [0, E) in order.
        sources: int32 or int64 [E], the row of `table` each entry reads (local id or halo slot).
        weight: float32 [E].
    """

    def __init__(self, parts: np.ndarray, sources: np.ndarray, weight: np.ndarray):
        self.num_parts = int(parts.shape[0])
        # the plan's arrays themselves (no copy when they are int32 or int64 / float32, as plans
        # hold them): the matrix is built from them on first use, and nothing per edge is kept beside it
        self.parts = parts
        sources = np.ascontiguousarray(sources)
        self.sources = sources if sources.dtype in (np.int32, np.int64) else sources.astype(np.int64)
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)
        self._matrix: torch.Tensor | None = None  # built on first use, for (n_out, rows) and a dtype

    def edge_target(self) -> np.ndarray:
        """int64 [E]: the output row of every entry, from the partitions (made when asked)."""
        if self.num_parts == 0:
            return np.zeros(0, np.int64)
        return np.repeat(self.parts[:, 0], self.parts[:, 2] - self.parts[:, 1])

    def matrix(self, n_out: int, rows: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """M sparse CSR [n_out, rows] of `dtype` with M[target, source] = the sum of the float32
        weights of the edges between them (the last shape and dtype asked for is kept). Its
        indices are int32 when the sizes allow (what MKL's SpMM reads: int64 ones are converted
        on every product), else int64."""
        m = self._matrix
        if m is None or tuple(m.shape) != (n_out, rows) or m.dtype != dtype:
            self._matrix = None  # the old matrix goes before the new one is built
            idx = torch.from_numpy(np.stack([self.edge_target(), self.sources.astype(np.int64, copy=False)]))
            with warnings.catch_warnings():  # torch's "sparse CSR support is in beta", once a process
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                coo = torch.sparse_coo_tensor(idx, torch.from_numpy(self.weight), (n_out, rows),
                                              check_invariants=False).coalesce()
                del idx
                m = coo.to(dtype).to_sparse_csr()
                del coo
                if max(n_out, rows, m.values().numel()) < 2**31 - 1:
                    m = torch.sparse_csr_tensor(m.crow_indices().to(torch.int32), m.col_indices().to(torch.int32),
                                                m.values(), (n_out, rows), check_invariants=False)
                self._matrix = m
        return m

    def add_into(self, out: torch.Tensor, table: torch.Tensor) -> None:
        """out[target] += sum over partitions of weight * table[sources], in out's dtype.

        table: [rows, D] of any float dtype (a 16-bit table is upcast to out.dtype first, so
        each 16-bit value is what the sum reads); out: float [n, D]."""
        if self.num_parts == 0 or table.shape[1] == 0:
            return
        t = table if table.dtype == out.dtype else table.to(out.dtype)
        out.add_(torch.sparse.mm(self.matrix(out.shape[0], table.shape[0], out.dtype), t))


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
