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
The sum over sampled edges is mgg.nn.block_sum with both degree factors as its scales and, when
the layer aggregates before projecting, its input dropout folded in. The block is duck-typed
(`ptr`, `col`, `row`, `deg`, `n_src`, `n_dst`).
"""
from __future__ import annotations

import torch

from ..block_sum import BlockDropout, block_sum
from .gcn_conv import GCNConv

__all__ = ["GCNBlockConv", "block_gcn_norm"]


def block_gcn_norm(block, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(src factor [n_src], dst factor [n_dst]): d_out(j)^-1/2 and d_in(i)^-1/2 of the block with
    a self loop per dst node (module doc)."""
    col = block.col
    # a scatter, not bincount: bincount reads its output size on the host (no CUDA graph capture)
    d_out = torch.zeros(block.n_src, dtype=torch.int64, device=col.device).index_add_(0, col, torch.ones_like(col))
    valid = getattr(block, "dst_valid", None)  # a padded block: only its real dst rows are src rows too
    d_out[: block.n_dst] += 1 if valid is None else valid.to(d_out.dtype)
    d_in = block.deg + 1
    return d_out.clamp(min=1).to(dtype).rsqrt(), d_in.to(dtype).rsqrt()


class GCNBlockConv(GCNConv):
    """GCN convolution on a Block: GCNConv's parameters, the block's normalised aggregation.

    Shapes:
        input float [n_src, in_channels] -> output float [n_dst, out_channels].
    """

    takes_block_dropout = True

    def forward(self, x: torch.Tensor, block, drop: BlockDropout | None = None) -> torch.Tensor:  # type: ignore[override]
        """x float [n_src, in] (before the input dropout `drop`) -> float [n_dst, out]."""
        if x.shape[0] != block.n_src:
            raise ValueError(f"GCNBlockConv: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
        project_first = self.out_channels <= self.in_channels  # aggregate the narrower side
        if project_first:
            h = (x if drop is None else drop.apply(x)) @ self.lin.weight.t()
            root, drop = h[: block.n_dst], None
        else:
            h = x
            root = x[: block.n_dst] if drop is None else drop.apply(x[: block.n_dst])
        src_f, dst_f = block_gcn_norm(block, h.dtype)
        # the self loops: (src_f * h)[i] * dst_f[i] for dst i, then the sampled edges
        out = root * (src_f[: block.n_dst] * dst_f).to(root.dtype).unsqueeze(1)
        out = out + block_sum(h, block, src_scale=src_f, dst_scale=dst_f, drop=drop)
        if not project_first:
            out = self.lin(out)
        return out if self.bias is None else out + self.bias
