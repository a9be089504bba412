"""Launchers of mgg/kernels/norm_relu.cu: batch norm's transform fused with the ReLU after it.

For float32 CUDA rows x [n, D] and per-column float32 [D] statistics (mean, invstd) and affine
parameters (weight, bias; None for 1 and 0):

* `bn_relu_forward`: relu(weight (x - mean) invstd + bias), one pass (torch: batch_norm_elemt
  then relu, two); with `relu=False` the transform alone, also any per-column affine map
  a x + c (mean 0, invstd 1, weight a, bias c);
* `bn_relu_backward_reduce`: (sum_dy, sum_dy_xmu) over this process's rows, each float32 [D], of
  the gradient masked by that ReLU (recomputed from x, never stored);
* `bn_relu_backward_elemt`: dx float32 [n, D] from the masked gradient and the two sums (summed
  over ranks by the caller) over `count` rows in all.

These are torch's batch_norm_elemt / batch_norm_backward_reduce / batch_norm_backward_elemt with
the ReLU folded in (mgg.nn.norm.DistBatchNorm's `relu=True`). `supports(x)` says whether the
kernels take x (D = 4 d4, d4 a power of two <= 256); `bn_relu_reference` is the same math in
plain torch (any device, any dtype), the tests' oracle beside float64. Built by mgg.kernels.build
as a plain cubin (no NVSHMEM), loaded with CuPy, launched on torch's current stream.
"""
from __future__ import annotations

import numpy as np
import torch

from .launch import blocks_for, float4_rows, kernel, launch

__all__ = ["supports", "bn_relu_forward", "bn_relu_backward_reduce", "bn_relu_backward_elemt",
           "bn_relu_reference", "THREADS", "BLOCKS_PER_SM", "REDUCE_BLOCKS_PER_SM"]

THREADS = 256              # blockDim.x of every kernel (the .cu's MGG_BN_THREADS)
BLOCKS_PER_SM = 8          # forward / elemt: grid = min(blocks of the work, 8 a SM)
REDUCE_BLOCKS_PER_SM = 4   # reduce: fewer blocks, fewer partial rows to sum


def supports(x: torch.Tensor) -> bool:
    """Whether the fused kernels take x: float32 CUDA [n, D], D = 4 d4 with d4 a power of two
    (D in 4, 8, 16, ..., 1024)."""
    if not (x.is_cuda and x.dtype == torch.float32 and x.dim() == 2):
        return False
    d = int(x.shape[1])
    d4 = d // 4
    return d % 4 == 0 and 1 <= d4 <= THREADS and (d4 & (d4 - 1)) == 0


def _vec(v: torch.Tensor | None, d: int, name: str) -> tuple[np.uint64, torch.Tensor | None]:
    """(pointer, kept reference) of a float32 [d] parameter vector; None -> null pointer."""
    if v is None:
        return np.uint64(0), None
    v = v.detach().to(torch.float32).contiguous()
    if v.shape != (d,):
        raise ValueError(f"bn_relu: {name} must have shape ({d},), got {tuple(v.shape)}")
    return np.uint64(v.data_ptr()), v


def _grid(n4: int, device: torch.device, per_sm: int) -> int:
    return blocks_for(n4, THREADS, device, per_sm)


def _launch(name: str, device: torch.device, grid: int, args: tuple) -> None:
    """Launch kernel `name` (grid blocks of THREADS) on torch's current stream of `device`."""
    launch(kernel("norm_relu", name, device), device, grid, THREADS, args)


def _params(x, mean, invstd, weight, bias):
    if not supports(x):
        raise ValueError(f"bn_relu: expected float32 CUDA rows [n, D] with D = 4 * 2^k <= 1024, got "
                         f"{x.dtype} {tuple(x.shape)} on {x.device}")
    d = int(x.shape[1])
    ptrs, keep = [], []
    for v, name in ((mean, "mean"), (invstd, "invstd"), (weight, "weight"), (bias, "bias")):
        if v is None and name in ("mean", "invstd"):
            raise ValueError(f"bn_relu: {name} is required")
        p, k = _vec(v, d, name)
        ptrs.append(p)
        keep.append(k)
    return ptrs, keep


def bn_relu_forward(x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                    weight: torch.Tensor | None, bias: torch.Tensor | None, relu: bool = True) -> torch.Tensor:
    """relu(weight (x - mean) invstd + bias): x float32 CUDA [n, D] -> float32 [n, D]; without
    the ReLU when `relu` is False (batch norm's transform, mgg_bn_forward)."""
    ptrs, keep = _params(x, mean, invstd, weight, bias)
    x = float4_rows(x)
    y = torch.empty_like(x)
    n4 = x.numel() // 4
    if n4 == 0:
        return y
    _launch("mgg_bn_relu_forward" if relu else "mgg_bn_forward", x.device, _grid(n4, x.device, BLOCKS_PER_SM),
            (np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), *ptrs, np.int64(n4), np.int32(x.shape[1] // 4)))
    del keep
    return y


def bn_relu_backward_reduce(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                            weight: torch.Tensor | None, bias: torch.Tensor | None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_dy, sum_dy_xmu), float32 [D] each, over the rows of x of dy' = dy where the forward's
    ReLU passed (weight (x - mean) invstd + bias > 0), else 0: sum dy' and sum dy' (x - mean).
    dy, x float32 CUDA [n, D]. Per-block partial sums, then their sum in a fixed order."""
    ptrs, keep = _params(x, mean, invstd, weight, bias)
    if dy.shape != x.shape:
        raise ValueError(f"bn_relu: dy {tuple(dy.shape)} and x {tuple(x.shape)} differ")
    x, dy = float4_rows(x), float4_rows(dy.to(torch.float32))
    d = int(x.shape[1])
    n4 = x.numel() // 4
    if n4 == 0:
        z = x.new_zeros(d)
        return z, z.clone()
    grid = _grid(n4, x.device, REDUCE_BLOCKS_PER_SM)
    partial = torch.empty(grid, 2, d, device=x.device, dtype=torch.float32)
    _launch("mgg_bn_relu_backward_reduce", x.device, grid,
            (np.uint64(dy.data_ptr()), np.uint64(x.data_ptr()), *ptrs, np.uint64(partial.data_ptr()),
             np.int64(n4), np.int32(d // 4)))
    del keep
    sums = partial.sum(0)
    return sums[0], sums[1]


def bn_relu_backward_elemt(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                           weight: torch.Tensor | None, bias: torch.Tensor | None, sum_dy: torch.Tensor,
                           sum_dy_xmu: torch.Tensor, count: float) -> torch.Tensor:
    """dx = (dy' - sum_dy / count - (x - mean) sum_dy_xmu / count invstd^2) invstd weight, with dy'
    the ReLU-masked gradient (as in bn_relu_backward_reduce) and the sums over all `count` rows of
    every rank. dy, x float32 CUDA [n, D] -> dx float32 [n, D]."""
    ptrs, keep = _params(x, mean, invstd, weight, bias)
    if dy.shape != x.shape:
        raise ValueError(f"bn_relu: dy {tuple(dy.shape)} and x {tuple(x.shape)} differ")
    if not count >= 1:
        raise ValueError(f"bn_relu: count must be >= 1, got {count}")
    d = int(x.shape[1])
    p_dy, k_dy = _vec(sum_dy, d, "sum_dy")
    p_xmu, k_xmu = _vec(sum_dy_xmu, d, "sum_dy_xmu")
    x, dy = float4_rows(x), float4_rows(dy.to(torch.float32))
    dx = torch.empty_like(x)
    n4 = x.numel() // 4
    if n4 == 0:
        return dx
    _launch("mgg_bn_relu_backward_elemt", x.device, _grid(n4, x.device, BLOCKS_PER_SM),
            (np.uint64(dy.data_ptr()), np.uint64(x.data_ptr()), *ptrs, p_dy, p_xmu, np.uint64(dx.data_ptr()),
             np.int64(n4), np.int32(d // 4), np.float32(1.0 / float(count))))
    del keep, k_dy, k_xmu
    return dx


def bn_relu_reference(x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor, weight: torch.Tensor | None,
                      bias: torch.Tensor | None, dy: torch.Tensor | None = None, count: float | None = None,
                      sums: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The kernels' math in plain torch, in x's dtype: y (dy None), else (sum_dy, sum_dy_xmu, dx)
    with `sums` (default: this x's own) and `count` (default: its rows)."""
    w = torch.ones_like(mean) if weight is None else weight
    b = torch.zeros_like(mean) if bias is None else bias
    t = w * (x - mean) * invstd + b
    if dy is None:
        return t.clamp_min(0)
    g = torch.where(t > 0, dy, torch.zeros_like(dy))
    own = (g.sum(0), (g * (x - mean)).sum(0))
    s_dy, s_xmu = own if sums is None else sums
    n = float(x.shape[0] if count is None else count)
    dx = (g - s_dy / n - (x - mean) * (s_xmu / n) * invstd * invstd) * invstd * w
    return own[0], own[1], dx
