"""The L-hop message-flow graph of a batch on the GPU, one host synchronisation per hop.

`sample_blocks_cuda` is what `sample_blocks` runs for CUDA tensors with the Fused-Map id map.
Per hop (mgg.kernels.sample_gpu.sample_hop_cuda): the sampling kernel writes the neighbors behind
the dst nodes into the id buffer, the Fused-Map kernels read the sampled count on the device, a
compaction kernel writes the unique ids, every neighbor's local id and the next hop's per-node
sample counts, and one small device-to-host copy brings (edges, unique nodes, next hop's edges):
exactly the sizes the next hop allocates with. The first hop's buffers are sized by
batch x fanout (the first hop's count is read first only for fanout -1). Each Block's edge-to-dst
index (`Block.row`) is made here too, with its size known, so the training step does not make it
(nor wait for its size) on its own stream.

The batches are the ones `sample_neighbors` + `fused_map` make hop by hop with the same
generator: the same kernel seeds (one draw per hop), the same sampling kernel, the same
first-occurrence numbering.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .block import Block
from .neighbor import kernel_seed

__all__ = ["sample_blocks_cuda"]


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
    edges = None if fanouts[0] > 0 or nodes.numel() == 0 else int(count.sum())
    blocks: list[Block] = []
    for hop_no, fanout in enumerate(fanouts):
        nxt = fanouts[hop_no + 1] if hop_no + 1 < len(fanouts) else 0
        hop = sample_hop_cuda(indptr, indices, nodes, count, fanout, kernel_seed(generator), edges, nxt)
        n_dst = int(nodes.numel())
        row = torch.repeat_interleave(torch.arange(n_dst, device=dev), hop.count, output_size=hop.edges)
        blocks.append(Block(hop.ptr, hop.local, int(hop.n_id.numel()), n_dst, row))
        nodes, count, edges = hop.n_id, hop.next_count, hop.next_edges
    blocks.reverse()
    return nodes, blocks
