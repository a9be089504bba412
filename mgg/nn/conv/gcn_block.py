"""GCNBlockConv: graph convolution over one sampled bipartite block (mini-batch training).

PyG's GCNConv has no bipartite form; on a block this follows DGL's `GraphConv(norm="both")`,
with a self loop added for every dst node (dst i is src i, see mgg.sample.block):

    out[i] = b + sum_{j in S(i) + {i}} (x_j W) / sqrt(d_out(j) * d_in(i))      for dst nodes i

    S(i)      the sampled src nodes of i (a sampled edge j -> i counts once per occurrence)
    d_in(i)   |S(i)| + 1 (its sampled edges and its self loop)
    d_out(j)  the block edges leaving src j, its self loop included when j is a dst node (>= 1)

Both degrees are those of the block, as DGL computes them on a block. When the block holds every
node as a dst and all neighbors (fanout -1), they are the full graph's degrees + 1 and, on a
symmetric graph, this is the full-graph `GCNConv` (D^-1/2 (A + I) D^-1/2 x W + b). The parameters
are GCNConv's (`lin.weight`, `bias`), so a trained block model loads into the full-graph `GCN`.
The block is duck-typed (`ptr`, `col`, `row`, `deg`, `n_src`, `n_dst`); torch ops only (CPU and
CUDA, differentiable).
"""
from __future__ import annotations

import torch

from .gcn_conv import GCNConv

__all__ = ["GCNBlockConv", "block_gcn_norm"]


def block_gcn_norm(block, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(src factor [n_src], dst factor [n_dst]): d_out(j)^-1/2 and d_in(i)^-1/2 of the block with
    a self loop per dst node (module doc)."""
    d_out = torch.bincount(block.col, minlength=block.n_src)
    d_out[: block.n_dst] += 1
    d_in = block.deg + 1
    return d_out.clamp(min=1).to(dtype).rsqrt(), d_in.to(dtype).rsqrt()


class GCNBlockConv(GCNConv):
    """GCN convolution on a Block: GCNConv's parameters, the block's normalised aggregation.

    Shapes:
        input float [n_src, in_channels] -> output float [n_dst, out_channels].
    """

    def forward(self, x: torch.Tensor, block) -> torch.Tensor:  # type: ignore[override]
        if x.shape[0] != block.n_src:
            raise ValueError(f"GCNBlockConv: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
        project_first = self.out_channels <= self.in_channels  # aggregate the narrower side
        h = x @ self.lin.weight.t() if project_first else x
        src_f, dst_f = block_gcn_norm(block, h.dtype)
        h = h * src_f.unsqueeze(1)
        out = h[: block.n_dst]  # the self loops
        if block.col.numel():
            out = out.index_add(0, block.row, h.index_select(0, block.col))
        out = out * dst_f.unsqueeze(1)
        if not project_first:
            out = self.lin(out)
        return out if self.bias is None else out + self.bias
