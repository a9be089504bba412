"""Fused mean aggregation (degree-adaptive executor of mgg.graph.adaptive, mode "mean").

Shared by SAGEConv (`fused=True`) and re-exported by GATConv's module, whose attention path runs
on the same fused executors: one halo exchange forward, scatter_halo_add backward.
"""
from __future__ import annotations

import torch

from ..graph.adaptive import fused_aggregation

__all__ = ["FusedMean", "fused_mean"]


class FusedMean(torch.autograd.Function):
    """out [n, D] = mean over in-neighbors (SAGE mean; isolated nodes 0), fused path. Collective."""

    @staticmethod
    def forward(ctx, x, fa):  # type: ignore[override]
        feat = x.detach().contiguous().unsqueeze(1)
        out, saved = fa.forward(feat, None, None)
        ctx.fa, ctx.saved_state = fa, saved
        ctx.save_for_backward(feat)
        return out.squeeze(1)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (feat,) = ctx.saved_tensors
        g = grad_out.contiguous().unsqueeze(1)
        gf, _, _ = ctx.fa.backward(g, None, ctx.saved_state, feat, None, None)
        return gf.squeeze(1), None


def fused_mean(x: torch.Tensor, dg, strategy: str | None = None) -> torch.Tensor:
    """Differentiable mean aggregation through the fused executor (== aggregate(x, dg, "mean"))."""
    return FusedMean.apply(x, fused_aggregation(dg, "mean", False, 0.0, strategy))
