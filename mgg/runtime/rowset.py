"""Output-row subsets of the aggregation: compute only the rows a loss or an evaluation reads.

A full-graph model needs its last layer only at the nodes its loss reads (the training nodes) or
that an evaluation scores (train, val and test). On ogbn-papers100M-like graphs those are about
1% of the nodes, yet the last aggregation, its transposed twin in the backward, and the dense
output layer run over every node. A `RowSet` names such a subset S of a rank's rows; the
DistGraph then keeps, beside each full plan, the plan of W_S (the rows of W in S) and of W_S^T:

    forward    out[i] = sum_j W[i, j] x[j] (+ diag[i] x[i]) for i in S, over S's in-edges only;
    transposed g'[j] = sum_{i in S} W[i, j] g[i] (+ diag[j] g[j]) over the same edges,

with the full graph's weights (the degrees stay global), in the full plan's entry order, so the
rows in S are bit for bit those of the full aggregation. Rows outside S are not meaningful
(their self term only); the transposed form is W_S^T g only for g that is zero outside S, which
is what the backward of `out[S]` passes. Both forms are built from this rank's forward and
transposed rows when the first plan of each direction is (mgg.graph.dist_graph), on the plan device.

Layers before the last need only the rows the next layer reads: its set and the sources of the
edges into it (`with_in_neighbours`; `DistGraph.register_layer_rows` chains them). An inner
layer's output keeps every row, but only those of its set are meaningful; the next layer reads
no other, and the gradient that comes back is zero outside the set, as W_S^T needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["RowSet", "keep_rows", "keep_entries", "global_row_mask", "with_in_neighbours"]


@dataclass(frozen=True)
class RowSet:
    """A named subset of one rank's rows (every rank registers the same name, collectively).

    name: the key of its plans in the DistGraph. index: int64 [k] sorted distinct local rows in
    [0, n_local) on the DistGraph's device. num_global: the subset's size over all ranks.
    """

    name: str
    index: torch.Tensor
    num_global: int

    def __len__(self) -> int:
        return int(self.index.numel())


def _segment_counts(mask: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    """int64 [n]: the number of True entries of `mask` in each CSR row of `indptr`."""
    cs = torch.zeros(mask.numel() + 1, dtype=torch.int64, device=mask.device)
    if mask.numel():
        torch.cumsum(mask, 0, out=cs[1:])
    at = cs[indptr]
    return at[1:] - at[:-1]


def _rebuilt(indptr: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(indptr)
    if counts.numel():
        torch.cumsum(counts, 0, out=out[1:])
    return out


def keep_rows(indptr: torch.Tensor, indices: torch.Tensor, row_mask: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR (indptr int64 [n + 1], indices [E]) with the rows where `row_mask` (bool [n]) is
    False emptied; entries keep their order. Tensors on one device."""
    counts = indptr[1:] - indptr[:-1]
    entry = torch.repeat_interleave(row_mask, counts, output_size=indices.numel())
    return _rebuilt(indptr, torch.where(row_mask, counts, 0)), indices[entry]


def keep_entries(indptr: torch.Tensor, indices: torch.Tensor, entry_mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR with only the entries where `entry_mask` (bool [E]) is True, in their order."""
    return _rebuilt(indptr, _segment_counts(entry_mask, indptr)), indices[entry_mask]


def global_row_mask(local_index: torch.Tensor, lo: int, num_nodes: int, comm, device: torch.device
                    ) -> torch.Tensor:
    """bool [num_nodes] on `device`: True at the global ids of every rank's subset (collective:
    one allgather of the subsets' global ids; no communication on one rank)."""
    ids = local_index.cpu().numpy().astype(np.int64) + lo
    parts = comm.allgather(ids) if comm.size > 1 else [ids]
    mask = torch.zeros(num_nodes, dtype=torch.bool, device=device)
    for p in parts:
        if len(p):
            mask[torch.from_numpy(np.asarray(p, dtype=np.int64)).to(device)] = True
    return mask


def with_in_neighbours(indptr: torch.Tensor, indices: torch.Tensor, rows: torch.Tensor, lo: int, hi: int,
                       num_nodes: int, comm) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(bool [hi - lo]: this rank's rows that are in this rank's subset or a source of an edge
    into any rank's subset; bool [num_nodes]: those sources over all ranks, or None on one rank).
    indptr/indices: this rank's forward CSR rows (targets lo..hi-1, global source ids); rows:
    int64 local rows of this rank's subset. Collective: one all-reduce (max) of a uint8 node mask
    over the ranks; none on one rank."""
    dev = indptr.device
    mine = torch.zeros(hi - lo, dtype=torch.bool, device=dev)
    mine[rows] = True
    _, sources = keep_rows(indptr, indices, mine)
    if comm.size > 1:
        mask = torch.zeros(num_nodes, dtype=torch.uint8, device=dev)
        mask[sources] = 1
        host = np.ascontiguousarray(mask.cpu().numpy())
        comm.allreduce_(host, "max")
        everywhere = torch.from_numpy(host).to(dev).bool()
        return mine | everywhere[lo:hi], everywhere
    mine[sources - lo] = True
    return mine, None
