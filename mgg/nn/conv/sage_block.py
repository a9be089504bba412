"""SAGEBlockConv: GraphSAGE (mean) over one sampled bipartite block (mini-batch training).

out[i] = lin_l(mean_{k in ptr[i]:ptr[i+1]} x[col[k]]) + lin_r(x[i])   for dst nodes i < n_dst

PyG `SAGEConv(aggr="mean")` semantics: bias on lin_l, no bias on lin_r (root weight), a dst node
without sampled neighbors aggregates to 0. The parameters are named as in `SAGEConv`, so a trained
block model loads into the full-graph `SAGE` (full-neighborhood inference).

The layer's input dropout comes in as `drop` (mgg.nn.block_sum.BlockDropout) and is folded into
the mean (one kernel on the GPU: each sampled row read once, no dropped copy of x); the root
rows x[:n_dst] are dropped with the same mask.

x may be `IndexedRows` (the feature table read through the batch's ids): the mean reads the table
through the index, the root rows are gathered alone. The root term is added by the second
product itself (`addmm_` into the first's output: no separate pass over [n_dst, out]).

The block is duck-typed (anything with `ptr`, `col`, `n_src`, `n_dst`, `row`, `deg`, e.g.
`mgg.sample.Block`); this module does not import mgg.sample.
"""
from __future__ import annotations

import torch

from ..block_sum import BlockDropout, block_sum
from ..indexed_rows import IndexedRows, head_rows, materialize
from .sage_conv import SAGEConv

__all__ = ["SAGEBlockConv", "block_mean"]


def block_mean(x: torch.Tensor | IndexedRows, block, drop: BlockDropout | None = None) -> torch.Tensor:
    """Mean of the sampled (dropped) src rows of every dst node: float [n_src, D] (or
    IndexedRows) -> [n_dst, D] (differentiable); isolated dst rows are 0."""
    if x.shape[0] != block.n_src:
        raise ValueError(f"block_mean: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
    inv_deg = 1.0 / block.deg.clamp(min=1).to(x.dtype)
    return block_sum(x, block, dst_scale=inv_deg, drop=drop)


class SAGEBlockConv(SAGEConv):
    """GraphSAGE mean convolution on a Block: SAGEConv's parameters, a block's aggregation.

    Shapes:
        input float32 [n_src, in_channels] -> output float32 [n_dst, out_channels].
    """

    takes_block_dropout = True
    takes_indexed_rows = True

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, root_weight: bool = True):
        super().__init__(in_channels, out_channels, bias=bias, root_weight=root_weight)

    def forward(self, x: torch.Tensor | IndexedRows, block, drop: BlockDropout | None = None) -> torch.Tensor:
        """x float [n_src, in] or IndexedRows (before the input dropout `drop`) -> float [n_dst, out]."""
        if self.out_channels < self.in_channels:  # mean is linear: project first (fewer columns)
            x = materialize(x)
            if drop is not None:
                x = drop.apply(x)
            out = block_mean(x @ self.lin_l.weight.t(), block)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
            root = x[: block.n_dst]
        else:
            out = self.lin_l(block_mean(x, block, drop))
            root = head_rows(x, block.n_dst)
            if drop is not None:
                root = drop.apply(root)
        if self.lin_r is not None:
            out = out.addmm_(root, self.lin_r.weight.t())
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"
