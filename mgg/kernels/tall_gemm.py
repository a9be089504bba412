"""Launcher of mgg/kernels/tall_gemm.cu: x @ b for a tall float32 matrix x and a narrow b, on TF32
tensor cores by the 3xTF32 split (float32 accuracy; the .cu's header says how and why).

    xb(x, b, bias, relu)   x [n, K] @ b [K, N] (+ bias [N]) (ReLU)  -> float32 [n, N]

    weight_grad(g, x)      g^T @ x for g [n, N], x [n, K]            -> float32 [N, K]

`b` may be any strided [K, N] view: weight.t() of a [N, K] Linear weight (the forward x W^T), or
the weight itself (the input gradient G W). `supports(k, n)` says which widths xb takes (K a
multiple of 4 up to 64, N even up to 64), `supports_weight_grad(k, n)` which weight_grad takes
(both multiples of 4 up to 64); mgg.nn.dense runs cuBLAS for the others. weight_grad adds its
per-block partial sums in a fixed order: the same result every run. Launched on torch's current
stream of x's GPU; built as a plain cubin (no NVSHMEM) by mgg.kernels.build.

`enabled()` is the switch mgg.nn.dense reads: the kernel runs unless `MGG_TALL_GEMM=0` is in the
environment (benchmarks compare against cuBLAS that way) or torch is asked for TF32 matmuls
(torch.backends.cuda.matmul.allow_tf32, `--tf32`: then cuBLAS's one TF32 product is both faster
and what was asked for).
"""
from __future__ import annotations

import os

import numpy as np
import torch

from .launch import float4_rows, kernel, launch, sm_count

__all__ = ["supports", "supports_weight_grad", "enabled", "xb", "weight_grad", "MAX_K", "MAX_N", "XB_WARPS",
           "BLOCKS_PER_SM", "TN_BLOCKS_PER_SM", "TN_CHUNK_ROWS"]

MAX_K = 64          # inner width: 4 chunks of 16 columns held in registers
MAX_N = 64          # outer width: 8 n8 accumulator tiles
XB_WARPS = 4        # the .cu's XB_WARPS: warps of a block, each owning 32-row tiles
BLOCKS_PER_SM = 2   # grid: 2 blocks a SM (about 250 registers a thread)
TN_BLOCKS_PER_SM = 4  # weight_grad grid: 4 blocks of 2 warps a SM (about 215 registers a thread)
TN_CHUNK_ROWS = 128   # the .cu's 8 * TN_CHUNK_STEPS: rows a tn block takes at a time


def _r(v: int, m: int) -> int:
    return -(-int(v) // m) * m


def supports(k: int, n: int) -> bool:
    """Whether the kernel takes x [., k] @ b [k, n]: k a multiple of 4 in 4..MAX_K, n even in
    2..MAX_N (rows of x start on 16 bytes, output pairs on 8)."""
    return 0 < k <= MAX_K and k % 4 == 0 and 0 < n <= MAX_N and n % 2 == 0


def supports_weight_grad(k: int, n: int) -> bool:
    """Whether `weight_grad` takes g [., n] and x [., k]: both multiples of 4 up to 64."""
    return 0 < k <= MAX_K and k % 4 == 0 and 0 < n <= MAX_N and n % 4 == 0


def enabled() -> bool:
    """False when MGG_TALL_GEMM=0 or torch allows TF32 matmuls (see the module docstring)."""
    return os.environ.get("MGG_TALL_GEMM", "1") != "0" and not torch.backends.cuda.matmul.allow_tf32


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def _check_matrices(op: str, **named: torch.Tensor) -> None:
    """ValueError naming the first of `named` that is not a float32 CUDA matrix."""
    for name, t in named.items():
        if not (t.is_cuda and t.dtype == torch.float32 and t.dim() == 2):
            raise ValueError(f"tall_gemm.{op}: {name} must be a float32 CUDA matrix, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")


def xb(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, relu: bool = False,
       stats_shift: torch.Tensor | None = None):
    """x [n, K] @ b [K, N] (+ bias [N]) (ReLU): float32 [n, N] (see the module docstring). x, b and
    bias float32 on one GPU; ValueError for widths the kernel does not take (`supports`).

    stats_shift (float32 [N] on x's GPU, e.g. a batch norm's running mean): also return the column
    mean and biased variance of the output, float64 [N] each, from the kernel's per-warp sums of
    (y - shift) and (y - shift)^2 added in float64 (a shift near the mean keeps the variance
    from cancelling): (y, mean, var). n must be >= 1 then."""
    _check_matrices("xb", x=x, b=b)
    n, k = (int(v) for v in x.shape)
    nout = int(b.shape[1])
    if b.shape[0] != k or b.device != x.device or not supports(k, nout):
        raise ValueError(f"tall_gemm.xb: x {tuple(x.shape)} @ b {tuple(b.shape)} on {x.device}, {b.device}: "
                         f"inner width a multiple of 4 up to {MAX_K}, outer width even up to {MAX_N}, one GPU")
    x = float4_rows(x)
    if bias is not None:
        bias = bias.detach().to(torch.float32).contiguous()
        if bias.shape != (nout,) or bias.device != x.device:
            raise ValueError(f"tall_gemm.xb: bias of shape {tuple(bias.shape)} on {bias.device} for {nout} "
                             f"outputs on {x.device}")
    out = torch.empty(n, nout, device=x.device, dtype=torch.float32)
    stats = stats_shift is not None
    if stats:
        if n == 0:
            raise ValueError("tall_gemm.xb: column statistics of an empty output")
        stats_shift = stats_shift.detach().to(torch.float32).contiguous()
        if stats_shift.shape != (nout,) or stats_shift.device != x.device:
            raise ValueError(f"tall_gemm.xb: stats_shift of shape {tuple(stats_shift.shape)} on "
                             f"{stats_shift.device} for {nout} outputs on {x.device}")
    if n == 0:
        return out
    kc, nt8 = _r(k, 16) // 16, 2 * (_r(nout, 16) // 16)
    fn = kernel("tall_gemm", f"mgg_tall_gemm_xb{'s' if stats else ''}_k{kc}_n{nt8}", x.device)
    smem = kc * 2 * nt8 * 32 * 16  # B, split, one float4 per (k-step, n8 tile, lane)
    fn.max_dynamic_shared_size_bytes = smem
    grid = max(1, min(-(-n // (32 * XB_WARPS)), sm_count(x.device) * BLOCKS_PER_SM))
    args = (_p(x), np.int64(n), np.int32(k), _p(b), np.int64(b.stride(0)), np.int64(b.stride(1)),
            np.int32(nout), _p(bias), _p(out), np.int32(bool(relu)))
    if not stats:
        launch(fn, x.device, grid, 32 * XB_WARPS, args, shared_mem=smem)
        return out
    partial = torch.empty(grid * XB_WARPS, 2, nout, device=x.device, dtype=torch.float32)
    launch(fn, x.device, grid, 32 * XB_WARPS, args + (_p(stats_shift), _p(partial)), shared_mem=smem)
    sums = partial.to(torch.float64).sum(0)  # [2, N]: sum (y - c), sum (y - c)^2
    d = sums[0] / n
    return out, stats_shift.to(torch.float64) + d, (sums[1] / n - d * d).clamp(min=0.0)


def weight_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """g^T @ x for g [n, N], x [n, K] float32 on one GPU: float32 [N, K] (see the module
    docstring); ValueError for widths the kernel does not take (`supports_weight_grad`)."""
    _check_matrices("weight_grad", g=g, x=x)
    n, nout = (int(v) for v in g.shape)
    k = int(x.shape[1])
    if x.shape[0] != n or x.device != g.device or not supports_weight_grad(k, nout):
        raise ValueError(f"tall_gemm.weight_grad: g {tuple(g.shape)}, x {tuple(x.shape)}: one row count, widths "
                         f"multiples of 4 up to {MAX_K}, one GPU")
    g, x = float4_rows(g), float4_rows(x)
    if n == 0:
        return torch.zeros(nout, k, device=g.device, dtype=torch.float32)
    nt8 = 2 if k <= 16 else 4 if k <= 32 else 8
    halves = 1 if nout <= 32 else 2
    grid = max(1, min(-(-n // TN_CHUNK_ROWS), sm_count(g.device) * TN_BLOCKS_PER_SM))
    partial = torch.empty(grid, nout, k, device=g.device, dtype=torch.float32)
    launch(kernel("tall_gemm", f"mgg_tall_gemm_tn_k{nt8}", g.device), g.device, grid, 32 * halves,
           (_p(g), _p(x), np.int64(n), np.int32(nout), np.int32(k), _p(partial)))
    return partial.sum(0)
