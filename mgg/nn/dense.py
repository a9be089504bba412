"""Dense projections of tall node matrices: x [N, F] @ W^T with N in the millions.

autograd's backward of `x @ W.t()` computes the weight gradient as x^T G ([F, N] @ [N, O]) and
transposes it; cuBLAS runs that float32 GEMM with its reduction over all N rows as a slow SIMT
kernel. G^T x ([O, N] @ [N, F]) is the same matrix, transposed, and cuBLAS runs it much faster.
Measured on one H200 (papers-like@0.1 layer 1: N = 11.1M, F = 128, O = 16; devrun/ab_project.py):
autograd's whole backward 5.01 ms, x^T G 3.09 ms, G^T x 2.26 ms, reading x and G once 1.33 ms
(a batched GEMM over row blocks plus a sum took 3.54 ms: not used). `project` is `x @ W^T` with
that backward; the result equals autograd's up to float32 summation order.
"""
from __future__ import annotations

import torch

__all__ = ["project", "TALL_ROWS"]

#: inputs with at least this many rows (on CUDA) take the custom backward
TALL_ROWS = 1 << 20


class _Project(torch.autograd.Function):
    """y = x W^T; backward: grad x = G W, grad W = G^T x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        g = g.contiguous()
        gx = g @ weight if ctx.needs_input_grad[0] else None
        gw = g.t() @ x if ctx.needs_input_grad[1] else None
        return gx, gw


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T (x float [N, F], weight [O, F] -> [N, O]), with the G^T x weight gradient
    when x is a tall CUDA matrix (>= TALL_ROWS rows); plain autograd otherwise."""
    if x.is_cuda and x.dim() == 2 and x.shape[0] >= TALL_ROWS and torch.is_grad_enabled():
        return _Project.apply(x, weight)
    return x @ weight.t()
