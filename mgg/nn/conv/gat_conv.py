"""GATConv (Velickovic et al., Graph Attention Networks) on the distributed graph, fused.

Per head h with W_h x_i = Wh_i [C] and attention vectors a_src, a_dst [C]:

    e_ij   = LeakyReLU(a_dst . Wh_i + a_src . Wh_j)          for j in N(i) + {i}
    alpha  = softmax_j(e_ij)
    out_i  = sum_j alpha_ij Wh_j                               (heads concatenated or averaged) + bias

(``attention="dot"``: e_ij = Wh_i . Wh_j / sqrt(C).) Each rank computes Wh and a_src.Wh for its
own nodes, fetches [Wh_j, a_src.Wh_j] of its remote neighbors in one halo exchange, and runs
scores, softmax and aggregation of its targets in one fused executor (mgg.graph.adaptive:
node- or edge-centric by degree). The backward is fused too: it recomputes alpha from the saved
per-target max and sum, and returns remote rows' gradients to their owners (scatter_halo_add).
"""
from __future__ import annotations

import torch
from torch import nn

from ...graph.adaptive import fused_aggregation
from ..fused import FusedMean, fused_mean  # noqa: F401 (re-exported: shared with SAGEConv)
from .base import GraphConv

__all__ = ["GATConv", "FusedAttention", "FusedMean", "attention_aggregate", "fused_mean"]


class FusedAttention(torch.autograd.Function):
    """out [n, heads, C] = fused attention aggregation of feat (see mgg.kernels.gat_cpu). Collective."""

    @staticmethod
    def forward(ctx, feat, src_score, dst, fa, dropout, generator):  # type: ignore[override]
        feat_d = feat.detach().contiguous()
        src_d = None if src_score is None else src_score.detach().contiguous()
        dst_d = dst.detach().contiguous()
        out, saved = fa.forward(feat_d, src_d, dst_d, dropout, generator)
        ctx.fa, ctx.saved_state, ctx.has_src = fa, saved, src_score is not None
        ctx.save_for_backward(feat_d, src_d if src_d is not None else feat_d.new_empty(0), dst_d, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        feat, src, dst, out = ctx.saved_tensors
        gf, gs, gd = ctx.fa.backward(grad_out.contiguous(), out, ctx.saved_state, feat,
                                     src if ctx.has_src else None, dst)
        return gf, gs, gd, None, None, None


def attention_aggregate(feat: torch.Tensor, src_score: torch.Tensor | None, dst: torch.Tensor, dg,
                        attention: str = "additive", negative_slope: float = 0.2,
                        add_self_loops: bool = True, dropout: float = 0.0,
                        generator: torch.Generator | None = None, strategy: str | None = None) -> torch.Tensor:
    """Differentiable fused attention aggregation over `dg`.

    Args:
        feat: [n_local, heads, C] (Wh). src_score: [n_local, heads] (a_src . Wh; additive only).
        dst: [n_local, heads] (a_dst . Wh) for additive, [n_local, heads, C] (Wh) for dot.
        strategy: "node" | "edge" | None (degree-adaptive).
    Returns:
        [n_local, heads, C].
    """
    fa = fused_aggregation(dg, attention, add_self_loops, negative_slope, strategy)
    return FusedAttention.apply(feat, src_score, dst, fa, float(dropout), generator)


class GATConv(GraphConv):
    """Graph attention convolution (PyG GATConv semantics for the defaults).

    Args:
        in_channels, out_channels: widths (out_channels per head).
        heads: attention heads. concat: concatenate heads ([n, heads * out]) or average ([n, out]).
        negative_slope: LeakyReLU slope of the additive scores.
        dropout: dropout on the attention coefficients while training (drawn per rank; 0 = off).
        add_self_loops: drop the graph's self loops and attend over N(i) + {i}.
        attention: "additive" (GAT) or "dot" (scaled dot product, no LeakyReLU).
        bias: learn an additive bias. strategy: force "node" / "edge" (None: degree-adaptive).
    Shapes:
        input float [n_local, in_channels] -> [n_local, heads * out_channels] or [n_local, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 attention: str = "additive", bias: bool = True, strategy: str | None = None):
        super().__init__()
        if attention not in ("additive", "dot"):
            raise ValueError(f"attention must be 'additive' or 'dot', got {attention!r}")
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, float(negative_slope), float(dropout)
        self.add_self_loops, self.attention, self.strategy = add_self_loops, attention, strategy
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        if attention == "additive":
            self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
            self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        else:
            self.register_parameter("att_src", None)
            self.register_parameter("att_dst", None)
        width = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.generator: torch.Generator | None = None  # attention-dropout generator (None: default)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        if self.att_src is not None:
            nn.init.xavier_uniform_(self.att_src)
            nn.init.xavier_uniform_(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, dg) -> torch.Tensor:
        h = self.lin(x).view(-1, self.heads, self.out_channels)
        if self.attention == "additive":
            src, dst = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)
        else:
            src, dst = None, h
        p = self.dropout if self.training else 0.0
        out = attention_aggregate(h, src, dst, dg, self.attention, self.negative_slope,
                                  self.add_self_loops, p, self.generator, self.strategy)
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, "
                f"attention={self.attention}")
