"""SAGEBlockConv: GraphSAGE (mean) over one sampled bipartite block (mini-batch training).

out[i] = lin_l(mean_{k in ptr[i]:ptr[i+1]} x[col[k]]) + lin_r(x[i])   for dst nodes i < n_dst

PyG `SAGEConv(aggr="mean")` semantics: bias on lin_l, no bias on lin_r (root weight), a dst node
without sampled neighbors aggregates to 0. The parameters are named as in `SAGEConv`, so a trained
block model loads into the full-graph `SAGE` (full-neighborhood inference).

The block is duck-typed (anything with `ptr`, `col`, `n_src`, `n_dst`, `row`, e.g.
`mgg.sample.Block`); this module does not import mgg.sample.
"""
from __future__ import annotations

import torch

from .sage_conv import SAGEConv

__all__ = ["SAGEBlockConv", "block_mean"]


def block_mean(x: torch.Tensor, block) -> torch.Tensor:
    """Mean of the sampled src rows of every dst node: float [n_src, D] -> [n_dst, D].

    index_add over the block's edges (CPU and CUDA, differentiable); isolated dst rows are 0.
    """
    if x.shape[0] != block.n_src:
        raise ValueError(f"block_mean: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
    out = x.new_zeros((block.n_dst, x.shape[1]))
    if block.col.numel():
        out = out.index_add(0, block.row, x.index_select(0, block.col))
    deg = block.deg.clamp(min=1).to(x.dtype).unsqueeze(1)
    return out / deg


class SAGEBlockConv(SAGEConv):
    """GraphSAGE mean convolution on a Block: SAGEConv's parameters, a block's aggregation.

    Shapes:
        input float32 [n_src, in_channels] -> output float32 [n_dst, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, root_weight: bool = True):
        super().__init__(in_channels, out_channels, bias=bias, root_weight=root_weight)

    def forward(self, x: torch.Tensor, block) -> torch.Tensor:
        if self.out_channels < self.in_channels:  # mean is linear: project first (fewer columns)
            out = block_mean(x @ self.lin_l.weight.t(), block)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(block_mean(x, block))
        if self.lin_r is not None:
            out = out + self.lin_r(x[: block.n_dst])
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"
