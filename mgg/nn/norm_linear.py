"""Batch norm + ReLU read by the next Linear's GEMM: y = (relu)(relu(bn(x)) W^T + b), the normalised
rows never written.

GIN's MLP is Linear -> DistBatchNorm -> ReLU -> Linear. Run as stages, the norm's kernel writes
z = relu(bn(x)) (float32 [n, D]) and the Linear's GEMM reads it back; the backward reads it again
for the weight gradient G^T z. Here the norm's training statistics give a per-column map
z = relu(s x + o) (s = w invstd, o = b - mean s), and the tall-GEMM kernels apply it to x's values
in registers as they read them (mgg/kernels/tall_gemm.cu, the `xbp` and `tnp` kernels): the
forward GEMM reads x instead of z, the weight gradient recomputes z from x, and the norm's
backward (which already reads x: it recomputes the ReLU's mask from it) gets dz = G' W from the
Linear's input-gradient GEMM. One pass over [n, D] (the norm's write of z and the GEMM's read of
it) goes, and z's memory.

It runs where every piece has its GPU kernel: DistBatchNorm training on its GPU path with the ReLU
fused (`DistBatchNorm.fuses_linear`), a tall float32 x whose widths the prologue kernels take
(mgg.kernels.tall_gemm.supports(..., prologue=True)), every row of the norm's output read.
Elsewhere GINConv runs the stages one by one. The values are those of the stages up to float32
rounding (the GEMM sums the same products; the map s x + o rounds once where the norm's kernel
computes (x - mean) invstd w + b).
"""
from __future__ import annotations

import torch
from torch import nn

from .norm import DistBatchNorm, gpu_batch_stats, gpu_norm_backward

__all__ = ["norm_relu_linear"]


class _NormReluLinear(torch.autograd.Function):
    """y = (relu)(relu(batch_norm(x)) W^T + b) with the norm's statistics over every rank's rows
    (mgg.nn.norm.gpu_batch_stats) and the norm + ReLU in the GEMM's prologue. Backward: the
    output ReLU's mask G', the bias gradient (its column sums) and grad W = G'^T relu(s x + o)
    (the prologue again) in one kernel (tall_gemm.relu_weight_grad), dz = G' W, then the norm +
    ReLU backward from dz (mgg.nn.norm.gpu_norm_backward; collective with several ranks)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lin_w, lin_b, bn, dg, counts, relu_out, local_stats):  # type: ignore[override]
        from ..kernels.tall_gemm import xb

        mean, invstd, count32, n, p = gpu_batch_stats(x, bn, dg, counts, local_stats)
        scale = invstd if weight is None else weight.detach() * invstd
        offset = -mean * scale if bias is None else bias.detach() - mean * scale
        y = xb(x, lin_w.detach().t(), None if lin_b is None else lin_b.detach(), relu_out,
               prologue=(scale, offset))
        ctx.save_for_backward(x, weight, bias, mean, invstd, lin_w, y if relu_out else None, scale, offset)
        ctx.dg, ctx.count, ctx.n, ctx.relu, ctx.world = dg, count32, n, True, p
        ctx.relu_out, ctx.has_lin_b = relu_out, lin_b is not None
        return y

    @staticmethod
    def backward(ctx, gy):  # type: ignore[override]
        from ..kernels.tall_gemm import weight_grad, xb
        from .dense import relu_backward

        x, weight, bias, mean, invstd, lin_w, y, scale, offset = ctx.saved_tensors
        g = gy.contiguous()
        need_lw, need_lb = ctx.needs_input_grad[3], ctx.has_lin_b and ctx.needs_input_grad[4]
        if ctx.relu_out:  # the mask, its sums and G'^T z in one kernel where it takes them
            g, glw, glb = relu_backward(g, y, x, need_lw, need_lb, prologue=(scale, offset))
        else:
            glw, glb = None, (g.sum(0) if need_lb else None)
        if need_lw and glw is None:
            glw = weight_grad(g, x, prologue=(scale, offset))
        glw = None if glw is None else glw.to(lin_w.dtype)
        gx = gw = gb = None
        if any(ctx.needs_input_grad[:3]):
            dz = xb(g, lin_w.detach())  # G' W: the gradient of relu(bn(x))
            gx, gw, gb = gpu_norm_backward(ctx, dz, x, weight, bias, mean, invstd)
        return gx, gw, gb, glw, glb, None, None, None, None, None


def fuses(norm: nn.Module, x: torch.Tensor, dg, linear: nn.Module) -> bool:
    """Whether `norm_relu_linear(norm, x, dg, linear, ...)` runs fused: norm a DistBatchNorm that
    `fuses_linear` x (training on its GPU path with the fused ReLU), linear an nn.Linear of
    float32 weights whose widths the prologue kernels take on x (tall float32 CUDA rows, not
    switched off: mgg.nn.dense.tall_gemm)."""
    if not (isinstance(norm, DistBatchNorm) and type(linear) is nn.Linear and linear.weight.dtype == torch.float32):
        return False
    if not norm.fuses_linear(x, dg):
        return False
    from .dense import tall_gemm

    k, o = int(linear.in_features), int(linear.out_features)
    return tall_gemm(x, k, o, prologue=True) and tall_gemm(x, k, o, weight_grad=True)


def norm_relu_linear(norm: DistBatchNorm, x: torch.Tensor, dg, linear: nn.Linear, relu_out: bool = False,
                     local_stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """(relu)(linear(relu(norm(x, dg)))) for x float32 [n_local, D] (CUDA; `fuses` must hold):
    float32 [n_local, linear.out_features], the norm + ReLU applied inside the GEMM (see the
    module docstring). `local_stats`: as DistBatchNorm.forward's. Collective while training with
    several ranks (the norm's statistics)."""
    counts = norm.gpu_counts(x, dg)
    return _NormReluLinear.apply(x.contiguous(), norm.weight, norm.bias, linear.weight, linear.bias, norm, dg,
                                 counts, bool(relu_out), local_stats)
