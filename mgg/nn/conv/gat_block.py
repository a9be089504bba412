"""GATBlockConv: graph attention over one sampled bipartite block (mini-batch training).

PyG's `GATConv((in, in), out)` on a bipartite graph with one shared linear map (dst i is src i,
see mgg.sample.block): per head with Wh = lin(x) [n_src, heads, C],

    e_ij   = LeakyReLU(a_dst . Wh_i + a_src . Wh_j)     for j in S(i), plus j = i (add_self_loops)
    alpha  = softmax over those j of e_ij
    out_i  = sum_j alpha_ij Wh_j   (heads concatenated or averaged) + bias     for dst nodes i

With `add_self_loops` (the default, as PyG for bipartite input: loops for the first n_dst
nodes) sampled edges j -> i with j == i are dropped and one self loop per dst node is added, so
every dst node attends to itself once. `attention="dot"`: e_ij = Wh_i . Wh_j / sqrt(C). The
attention dropout (`dropout`, training only) drops coefficients after the softmax, drawn from
`self.generator`. The parameters are GATConv's (`lin.weight`, `att_src`, `att_dst`, `bias`), so a
trained block model loads into the full-graph `GAT`. Torch ops only (CPU and CUDA,
differentiable): a segment softmax by scatter max (detached: the softmax does not depend on the
shift), exp, and index_add sums.
"""
from __future__ import annotations

import math

import torch

from .gat_conv import GATConv

__all__ = ["GATBlockConv", "block_attention_edges"]


def block_attention_edges(block, add_self_loops: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 (dst [k], src [k]) local indices of the edges a dst node attends over: the sampled
    ones and, with `add_self_loops`, (i, i) for every dst node i instead of sampled self edges."""
    row, col = block.row, block.col
    if not add_self_loops:
        return row, col
    keep = col != row
    loops = torch.arange(block.n_dst, device=row.device)
    return torch.cat([row[keep], loops]), torch.cat([col[keep], loops])


class GATBlockConv(GATConv):
    """Graph attention convolution on a Block: GATConv's parameters and options (`strategy` does
    not apply).

    Shapes:
        input float [n_src, in_channels] -> [n_dst, heads * out_channels] (concat) or
        [n_dst, out_channels].
    """

    def forward(self, x: torch.Tensor, block) -> torch.Tensor:  # type: ignore[override]
        if x.shape[0] != block.n_src:
            raise ValueError(f"GATBlockConv: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
        heads, c, n_dst = self.heads, self.out_channels, block.n_dst
        h = self.lin(x).view(-1, heads, c)
        dst, src = block_attention_edges(block, self.add_self_loops)
        if self.attention == "additive":
            a_src = (h * self.att_src).sum(-1)                     # [n_src, heads]
            a_dst = (h[:n_dst] * self.att_dst).sum(-1)             # [n_dst, heads]
            e = torch.nn.functional.leaky_relu(a_src[src] + a_dst[dst], self.negative_slope)
        else:
            e = (h[dst] * h[src]).sum(-1) / math.sqrt(c)
        idx = dst.unsqueeze(1).expand(-1, heads)
        e_max = e.new_full((n_dst, heads), float("-inf")).scatter_reduce(0, idx, e.detach(), "amax")
        p = torch.exp(e - e_max[dst])
        alpha = p / p.new_zeros((n_dst, heads)).index_add(0, dst, p)[dst]
        if self.training and self.dropout > 0.0:
            keep = torch.rand(alpha.shape, generator=self.generator, device=alpha.device) >= self.dropout
            alpha = alpha * keep.to(alpha.dtype) / (1.0 - self.dropout)
        out = h.new_zeros((n_dst, heads, c)).index_add(0, dst, alpha.unsqueeze(-1) * h[src])
        out = out.reshape(n_dst, heads * c) if self.concat else out.mean(dim=1)
        return out if self.bias is None else out + self.bias
