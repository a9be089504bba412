"""GCNBlockConv: graph convolution over one sampled bipartite block (mini-batch training).

The full graph's GCNConv, out = D^-1/2 (A + I) D^-1/2 x W + b with D the in-degree + 1, estimated
from the sampled neighbors (dst i is src i, see mgg.sample.block):

    out[i] = b + ( x_i / D_i + (deg(i) / s(i)) sum_{j in S(i)} x_j / sqrt(D_i D_j) ) W     for dst nodes i

    S(i)   the s(i) sampled src nodes of i (a sampled edge j -> i counts once per occurrence)
    deg(i) the graph's in-degree of i, D_i = deg(i) + 1: the *whole graph's* degrees
           (`Block.src_degree`, which mgg.sample.sample_blocks sets), not the block's

Sampling s(i) of i's deg(i) neighbors uniformly, the sum times deg(i) / s(i) is an unbiased
estimate of the sum over all of them, so training and the full-graph evaluation (the model's
`to_full_graph()` twin) normalise alike. With every neighbor sampled (fanout -1, or a fanout at
least every degree) it is `GCNConv` exactly. A seed's output depends on its own sampled
neighborhood only, not on the other seeds of its batch. (DGL's `GraphConv(norm="both")` on a
block divides by the *block's* degrees instead; a src node of a large graph has few block edges
next to its many graph edges, so its rows weigh several times more in training than in the
evaluation.) The parameters are GCNConv's (`lin.weight`, `bias`), so a trained block model
loads into the full-graph `GCN`. The sum over sampled edges is mgg.nn.block_sum with the two
factors as its scales and, when the layer aggregates before projecting, its input dropout folded
in. The block is duck-typed (`ptr`, `col`, `deg`, `src_degree`, `n_src`, `n_dst`).
"""
from __future__ import annotations

import torch

from ..block_sum import BlockDropout, block_sum
from ..indexed_rows import IndexedRows, head_rows, materialize
from .gcn_conv import GCNConv

__all__ = ["GCNBlockConv", "block_gcn_norm"]


def block_gcn_norm(block, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src factor [n_src] D_j^-1/2, dst factor [n_dst] D_i^-1/2 deg(i) / s(i) (0 where i has no
    sampled edge), self factor [n_dst] 1 / D_i) of the block (module doc)."""
    degree = getattr(block, "src_degree", None)
    if degree is None:
        raise ValueError("GCNBlockConv needs the graph's in-degree of the block's src nodes (Block.src_degree, "
                         "set by mgg.sample.sample_blocks)")
    d = degree.to(dtype) + 1.0
    src_f = d.rsqrt()
    deg_dst, sampled = degree[: block.n_dst].to(dtype), block.deg.to(dtype)
    dst_f = torch.where(sampled > 0, src_f[: block.n_dst] * deg_dst / sampled.clamp(min=1.0), torch.zeros_like(sampled))
    return src_f, dst_f, 1.0 / d[: block.n_dst]


class GCNBlockConv(GCNConv):
    """GCN convolution on a Block: GCNConv's parameters, the full graph's normalisation estimated
    from the sampled neighbors (module doc).

    Shapes:
        input float [n_src, in_channels] -> output float [n_dst, out_channels].
    """

    takes_block_dropout = True
    takes_indexed_rows = True

    def forward(self, x: torch.Tensor | IndexedRows, block, drop: BlockDropout | None = None) -> torch.Tensor:  # type: ignore[override]
        """x float [n_src, in] or IndexedRows (before the input dropout `drop`) -> float [n_dst, out]."""
        if x.shape[0] != block.n_src:
            raise ValueError(f"GCNBlockConv: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
        # aggregate the narrower side; at equal widths aggregate first: the product then runs on the
        # n_dst rows only, not on all n_src (the hidden layers of a sampled stack: 15K against 400K)
        project_first = self.out_channels < self.in_channels
        if project_first:
            x = materialize(x)
            h = (x if drop is None else drop.apply(x)) @ self.lin.weight.t()
            root, drop = h[: block.n_dst], None
        else:
            h = x
            root = head_rows(x, block.n_dst)
            if drop is not None:
                root = drop.apply(root)
        src_f, dst_f, self_f = block_gcn_norm(block, h.dtype)
        out = root * self_f.unsqueeze(1) + block_sum(h, block, src_scale=src_f, dst_scale=dst_f, drop=drop)
        if not project_first:
            out = self.lin(out)
        return out if self.bias is None else out + self.bias
