"""The L-hop message-flow graph of a batch on the GPU, with one host synchronisation a batch.

`sample_blocks_cuda` is what `sample_blocks` runs for CUDA tensors with the Fused-Map id map.
With every fanout >= 1 (mgg.kernels.sample_gpu.sample_hop_bounded_cuda) no hop waits for the
host: a hop's buffers are sized by upper bounds (dst bound x fanout edges, at most every node
of the graph), its kernels read the real counts on the device (the previous hop's number of
nodes, this hop's sampled edges), the sampled neighbors land right behind the real dst nodes,
and the compaction writes the next hop's per-node sample counts (0 past the real nodes). One
small device-to-host copy at the end brings every hop's (edges, nodes), and the blocks are the
buffers' prefixes. A hop whose bound would pass MAX_BOUND_ELEMENTS first reads its real node
count (one more synchronisation). With a fanout of -1 (every neighbor) the edge count has no
bound: each hop then reads its sizes (mgg.kernels.sample_gpu.sample_hop_cuda, one
synchronisation a hop). `Block.row` is left to be made where it is used (GAT's index_add; the
block_sum aggregations read `ptr` and `col` only).

The batches are the ones `sample_neighbors` + `fused_map` make hop by hop with the same
generator: the same kernel seeds (one draw per hop), the same sampling kernel, the same
first-occurrence numbering.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .block import Block
from .neighbor import kernel_seed

__all__ = ["sample_blocks_cuda", "MAX_BOUND_ELEMENTS"]

#: the most id-buffer elements (dst bound + edge bound) a hop allocates before it reads its real
#: dst count instead (about 40 bytes each across its buffers: 1.3 GB)
MAX_BOUND_ELEMENTS = 1 << 25


def sample_blocks_cuda(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts: Sequence[int],
                       generator: torch.Generator) -> tuple[torch.Tensor, list[Block]]:
    """`sample_blocks` on the GPU (see the module doc).

    Args:
        indptr: int64 [N + 1] CUDA tensor. indices: int64 [E] CUDA or pinned host tensor.
        seeds: int64 [B] unique node ids. fanouts: per hop (validated: >= 1 or -1), fanouts[0]
            for the hop from the seeds. generator: CPU generator of the kernel seeds.
    Returns:
        (n_id int64 [U], L Blocks input layer first), on indptr's device.
    """
    from ..kernels.sample_gpu import sample_counts_cuda, sample_hop_cuda

    dev = indptr.device
    nodes = seeds.to(device=dev, dtype=torch.int64).contiguous()
    count = sample_counts_cuda(indptr, nodes, fanouts[0])
    if nodes.numel() and all(f >= 1 for f in fanouts):
        return _sample_bounded(indptr, indices, nodes, count, fanouts, generator)
    edges = None if fanouts[0] > 0 or nodes.numel() == 0 else int(count.sum())
    blocks: list[Block] = []
    for hop_no, fanout in enumerate(fanouts):
        nxt = fanouts[hop_no + 1] if hop_no + 1 < len(fanouts) else 0
        hop = sample_hop_cuda(indptr, indices, nodes, count, fanout, kernel_seed(generator), edges, nxt)
        blocks.append(Block(hop.ptr, hop.local, int(hop.n_id.numel()), int(nodes.numel())))
        nodes, count, edges = hop.n_id, hop.next_count, hop.next_edges
    blocks.reverse()
    return nodes, blocks


def _sample_bounded(indptr: torch.Tensor, indices: torch.Tensor, nodes: torch.Tensor, count: torch.Tensor,
                    fanouts: Sequence[int], generator: torch.Generator) -> tuple[torch.Tensor, list[Block]]:
    """`sample_blocks_cuda` for fanouts >= 1: bounded buffers, one read of the sizes (module doc)."""
    from ..kernels.sample_gpu import sample_hop_bounded_cuda

    n_nodes = None   # the dst count on the device (None: all of `nodes`)
    hops = []
    for hop_no, fanout in enumerate(fanouts):
        nxt = fanouts[hop_no + 1] if hop_no + 1 < len(fanouts) else 0
        if n_nodes is not None and nodes.numel() * (1 + fanout) > MAX_BOUND_ELEMENTS:
            real = int(n_nodes)   # a bound this large costs more memory than a synchronisation
            nodes, count, n_nodes = nodes[:real], count[:real], None
        hops.append(sample_hop_bounded_cuda(indptr, indices, nodes, n_nodes, count, fanout,
                                            kernel_seed(generator), nxt))
        nodes, n_nodes, count = hops[-1].n_id, hops[-1].unique, hops[-1].next_count
    sizes = torch.cat([t for h in hops for t in (h.edges, h.unique)]).tolist()   # the one synchronisation
    blocks: list[Block] = []
    for i, hop in enumerate(hops):
        edges, unique = int(sizes[2 * i]), int(sizes[2 * i + 1])
        n_dst = int(sizes[2 * i - 1]) if i else int(hop.ptr.numel()) - 1   # the previous hop's nodes; the seeds
        blocks.append(Block(hop.ptr[: n_dst + 1], hop.local[:edges], unique, n_dst))
    blocks.reverse()
    return hops[-1].n_id[: int(sizes[-1])], blocks
