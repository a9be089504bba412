"""The data structures a sampled mini-batch is made of: bipartite `Block`s and the `SampledBatch`.

Layout (as DGL's blocks / PyG's NeighborLoader): the node sets of the hops are nested prefixes of
one array `n_id` (int64 [U], global ids):

    n_id[:B]            the seeds (batch nodes), in batch order
    n_id[:U_1]          seeds + their sampled 1-hop neighbors
    ...
    n_id[:U_L] = n_id   every node whose input features the batch reads

Block l (input layer first) maps the src nodes n_id[:n_src] to the dst nodes n_id[:n_dst]
(n_dst <= n_src): dst node i aggregates the src nodes col[ptr[i]:ptr[i+1]] (local indices into
its src set). Because dst nodes are the first n_dst src nodes, a layer's self term is h[:n_dst].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Block", "SampledBatch"]


@dataclass
class Block:
    """One bipartite message-flow layer.

    Attributes:
        ptr: int64 [n_dst + 1] CSR row pointer over dst nodes.
        col: int64 [nnz] local src index (into n_id[:n_src]) of every sampled edge.
        n_src: number of src nodes (rows of the layer's input).
        n_dst: number of dst nodes (rows of the layer's output); dst i is src i.
    """

    ptr: torch.Tensor
    col: torch.Tensor
    n_src: int
    n_dst: int
    _row: torch.Tensor | None = field(default=None, repr=False, compare=False)
    #: int64 [n_src]: the whole graph's in-degree of every src node (dst i is src i), set by
    #: `mgg.sample.sample_blocks`; GCN normalises with it. None: not known
    src_degree: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.ptr.dim() != 1 or self.ptr.numel() != self.n_dst + 1:
            raise ValueError(f"Block: ptr must be [n_dst + 1] = [{self.n_dst + 1}], got {tuple(self.ptr.shape)}")
        if self.n_dst > self.n_src:
            raise ValueError(f"Block: n_dst ({self.n_dst}) > n_src ({self.n_src}); dst nodes are a prefix of src")

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the block holds (what a stream that reads the block must keep alive)."""
        return tuple(t for t in (self.ptr, self.col, self._row, self.src_degree) if t is not None)

    @property
    def num_edges(self) -> int:
        return int(self.col.numel())

    @property
    def deg(self) -> torch.Tensor:
        """int64 [n_dst] sampled in-degree of every dst node."""
        return self.ptr[1:] - self.ptr[:-1]

    @property
    def row(self) -> torch.Tensor:
        """int64 [nnz] dst index of every edge (computed once, with its size given: no host
        synchronisation on a GPU; the GPU sampler makes it with the block)."""
        if self._row is None:
            self._row = torch.repeat_interleave(torch.arange(self.n_dst, device=self.ptr.device), self.deg,
                                                output_size=self.num_edges)
        return self._row

    def to(self, device: torch.device | str) -> "Block":
        return Block(self.ptr.to(device), self.col.to(device), self.n_src, self.n_dst,
                     None if self._row is None else self._row.to(device),
                     None if self.src_degree is None else self.src_degree.to(device))

    def __repr__(self) -> str:
        return f"Block(n_src={self.n_src}, n_dst={self.n_dst}, num_edges={self.num_edges})"


@dataclass
class SampledBatch:
    """What `NeighborLoader` yields for one step.

    Attributes:
        n_id: int64 [U] global ids of every node of the batch (seeds first).
        blocks: list of L Blocks, input layer first (blocks[0].n_src == U, blocks[-1].n_dst == B).
        x: float32 [U, F] input features of n_id (on the loader's device), or, from a loader
            with `index_features`, mgg.nn.IndexedRows of the feature table (the model reads them).
        y: int64 [B] labels of the seeds.
        seeds: int64 [B] global ids of the seeds (== n_id[:B]).
        bytes_fetched: feature bytes read from the feature source for this batch (local slice,
            remote gets and host tier together; rows reused from the previous batch excluded).
        rows_fetched: rows read from the feature source.
        rows_reused: rows copied from the previous batch's resident features instead.
        bytes_remote: the part of bytes_fetched that came from other ranks (one-sided gets).
    """

    n_id: torch.Tensor
    blocks: list[Block]
    x: Any   # torch.Tensor | mgg.nn.IndexedRows
    y: torch.Tensor
    seeds: torch.Tensor
    bytes_fetched: int = 0
    rows_fetched: int = 0
    rows_reused: int = 0
    bytes_remote: int = 0

    @property
    def batch_size(self) -> int:
        return int(self.seeds.numel())

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.numel())

    def to(self, device: torch.device | str) -> "SampledBatch":
        return SampledBatch(self.n_id.to(device), [b.to(device) for b in self.blocks], self.x.to(device),
                            self.y.to(device), self.seeds.to(device), self.bytes_fetched, self.rows_fetched,
                            self.rows_reused, self.bytes_remote)
