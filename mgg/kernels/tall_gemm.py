"""Launcher of mgg/kernels/tall_gemm.cu: x @ b for a tall float32 matrix x and a narrow b, on TF32
tensor cores by the 3xTF32 split (float32 accuracy; the .cu's header says how and why).

    xb(x, b, bias, relu)   x [n, K] @ b [K, N] (+ bias [N]) (ReLU)  -> float32 [n, N]
    xb(..., prologue=(s, o))   the same on relu(s x + o) (s, o float32 [K]: a batch norm + ReLU
                           of x applied as the kernel reads it; the normalised x is never written)

    weight_grad(g, x)      g^T @ x for g [n, N], x [n, K]            -> float32 [N, K]
    weight_grad(g, x, prologue=(s, o))   g^T @ relu(s x + o)
    relu_weight_grad(g, y, x)   the weight gradient of y = relu(x W^T + b) given g = dL/dy:
                           (g'^T @ x, g', column sums of g') with g' = g where y > 0 (the ReLU's
                           backward in the same pass: g' written, its sums the bias gradient)

`b` may be any strided [K, N] view: weight.t() of a [N, K] Linear weight (the forward x W^T), or
the weight itself (the input gradient G W). `supports(k, n)` says which widths xb takes (K a
multiple of 4 up to 128: above 64 in two passes over X's columns, as a first layer's 100-wide
input; N even up to 64; the prologue up to K = 64), `supports_weight_grad(k, n)` which
weight_grad takes (both multiples of 4 up to 64); mgg.nn.dense runs cuBLAS for the others (at
[2.45M, 100] the weight gradient as (x^T g)^T on four warps a block took 0.92-1.05 ms against
cuBLAS's 0.84-0.90: bench/results/2026-11-26-h200x1-d399e4f/c1). weight_grad adds its
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

__all__ = ["supports", "supports_weight_grad", "enabled", "xb", "weight_grad", "relu_weight_grad", "MAX_K", "MAX_K_ONE_PASS", "MAX_N",
           "XB_WARPS",
           "BLOCKS_PER_SM", "TN_BLOCKS_PER_SM", "TN_CHUNK_ROWS"]

MAX_K = 128         # inner width: 4 chunks of 16 columns held in registers a pass, 2 passes
MAX_K_ONE_PASS = 64  # ... in one pass (the prologue's limit)
MAX_N = 64          # outer width: 8 n8 accumulator tiles
XB_WARPS = 4        # the .cu's XB_WARPS: warps of a block, each owning 32-row tiles
BLOCKS_PER_SM = 2   # grid: 2 blocks a SM (about 250 registers a thread)
TN_BLOCKS_PER_SM = 4  # weight_grad grid: 4 blocks of 2 warps a SM (about 215 registers a thread)
TN_CHUNK_ROWS = 128   # the .cu's 8 * TN_CHUNK_STEPS: rows a tn block takes at a time


def _r(v: int, m: int) -> int:
    return -(-int(v) // m) * m


def supports(k: int, n: int, prologue: bool = False) -> bool:
    """Whether the kernel takes x [., k] @ b [k, n]: k a multiple of 4 in 4..MAX_K (with
    `prologue`: ..MAX_K_ONE_PASS), n even in 2..MAX_N (rows of x start on 16 bytes, output pairs
    on 8)."""
    top = MAX_K_ONE_PASS if prologue else MAX_K
    return 0 < k <= top and k % 4 == 0 and 0 < n <= MAX_N and n % 2 == 0


def supports_weight_grad(k: int, n: int) -> bool:
    """Whether `weight_grad` (and `relu_weight_grad`) takes g [., n] and x [., k], with a
    prologue on x or not: both multiples of 4 up to 64."""
    return 0 < k <= MAX_K_ONE_PASS and k % 4 == 0 and 0 < n <= MAX_N and n % 4 == 0


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


def _prologue(op: str, prologue, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The prologue's (scale, offset) as float32 contiguous [k] on `device`, or ValueError."""
    s, o = (t.detach().to(torch.float32).contiguous() for t in prologue)
    if s.shape != (k,) or o.shape != (k,) or s.device != device or o.device != device:
        raise ValueError(f"tall_gemm.{op}: prologue scale {tuple(s.shape)} and offset {tuple(o.shape)} on "
                         f"{s.device}, {o.device}: [{k}] each on {device}")
    return s, o


def xb(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, relu: bool = False,
       stats_shift: torch.Tensor | None = None,
       prologue: tuple[torch.Tensor, torch.Tensor] | None = None):
    """x [n, K] @ b [K, N] (+ bias [N]) (ReLU): float32 [n, N] (see the module docstring). x, b and
    bias float32 on one GPU; ValueError for widths the kernel does not take (`supports`).

    prologue (scale, offset: float32 [K] each on x's GPU): relu(scale x + offset) @ b instead,
    the map applied to x's values in registers (a batch norm + ReLU of x, fused into the GEMM
    that reads its output); K <= 64, no stats_shift.

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
    if prologue is not None:
        if stats_shift is not None or not supports(k, nout, prologue=True):
            raise ValueError(f"tall_gemm.xb: a prologue takes inner widths up to {MAX_K_ONE_PASS} (got {k}) and "
                             f"no column statistics")
        prologue = _prologue("xb", prologue, k, x.device)
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
    chunks, nt8 = _r(k, 16) // 16, 2 * (_r(nout, 16) // 16)
    passes = 1 if chunks <= 4 else 2
    kc = -(-chunks // passes)  # chunks a pass
    kind = "p" if prologue is not None else "s" if stats else ""
    fn = kernel("tall_gemm", f"mgg_tall_gemm_xb{kind}_k{kc}_n{nt8}{'_p2' if passes == 2 else ''}", x.device)
    # B, split, one float4 per (k-step, n8 tile, lane); the prologue's scale and offset
    smem = kc * passes * (2 * nt8 * 32 + (8 if prologue is not None else 0)) * 16
    fn.max_dynamic_shared_size_bytes = smem
    grid = max(1, min(-(-n // (32 * XB_WARPS)), sm_count(x.device) * BLOCKS_PER_SM))
    args = (_p(x), np.int64(n), np.int32(k), _p(b), np.int64(b.stride(0)), np.int64(b.stride(1)),
            np.int32(nout), _p(bias), _p(out), np.int32(bool(relu)))
    if prologue is not None:
        launch(fn, x.device, grid, 32 * XB_WARPS, args + (_p(prologue[0]), _p(prologue[1])), shared_mem=smem)
        return out
    if not stats:
        launch(fn, x.device, grid, 32 * XB_WARPS, args, shared_mem=smem)
        return out
    partial = torch.empty(grid * XB_WARPS, 2, nout, device=x.device, dtype=torch.float32)
    launch(fn, x.device, grid, 32 * XB_WARPS, args + (_p(stats_shift), _p(partial)), shared_mem=smem)
    sums = partial.to(torch.float64).sum(0)  # [2, N]: sum (y - c), sum (y - c)^2
    d = sums[0] / n
    return out, stats_shift.to(torch.float64) + d, (sums[1] / n - d * d).clamp(min=0.0)


def weight_grad(g: torch.Tensor, x: torch.Tensor,
                prologue: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """g^T @ x for g [n, N], x [n, K] float32 on one GPU: float32 [N, K] (see the module
    docstring); ValueError for widths the kernel does not take (`supports_weight_grad`).
    prologue (scale, offset: float32 [K] each on x's GPU): g^T @ relu(scale x + offset)."""
    return _tn("weight_grad", g, x, prologue, None)[0]


def relu_weight_grad(g: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
                     prologue: tuple[torch.Tensor, torch.Tensor] | None = None):
    """(g'^T @ x float32 [N, K], g' float32 [n, N], column sums of g' float32 [N]) with g' = g
    where y > 0, else 0: the backward of y = relu(x W^T + b) (g = dL/dy, y the ReLU's output,
    both [n, N]) in one pass over g, y and x, instead of a mask pass writing g' and then the
    GEMM reading it (mgg.nn.dense). prologue: as weight_grad's, on x."""
    _check_matrices("relu_weight_grad", y=y)
    if y.shape != g.shape or y.device != g.device:
        raise ValueError(f"tall_gemm.relu_weight_grad: y {tuple(y.shape)} on {y.device} for g {tuple(g.shape)} "
                         f"on {g.device}")
    return _tn("relu_weight_grad", g, x, prologue, y)


def _tn(op: str, g: torch.Tensor, x: torch.Tensor, prologue, y: torch.Tensor | None):
    """The tn kernels: (g'^T x, g', column sums of g') with g' = g where y > 0 (y given), else
    (g^T x, None, None)."""
    _check_matrices(op, g=g, x=x)
    n, nout = (int(v) for v in g.shape)
    k = int(x.shape[1])
    if x.shape[0] != n or x.device != g.device or not supports_weight_grad(k, nout):
        raise ValueError(f"tall_gemm.{op}: g {tuple(g.shape)}, x {tuple(x.shape)}: one row count, widths "
                         f"multiples of 4 up to {MAX_K_ONE_PASS}, one GPU")
    if prologue is not None:
        prologue = _prologue(op, prologue, k, x.device)
    g, x = float4_rows(g), float4_rows(x)
    if y is not None:
        y = float4_rows(y)
    if n == 0:
        zero = torch.zeros(nout, k, device=g.device, dtype=torch.float32)
        return (zero, None, None) if y is None else (zero, g.clone(), g.new_zeros(nout))
    nt8 = 2 if k <= 16 else 4 if k <= 32 else 8
    halves = 1 if nout <= 32 else 2
    grid = max(1, min(-(-n // TN_CHUNK_ROWS), sm_count(g.device) * TN_BLOCKS_PER_SM))
    partial = torch.empty(grid, nout, k, device=g.device, dtype=torch.float32)
    gm = gsum = None
    if y is not None:
        gm = torch.empty_like(g)
        gsum = torch.empty(grid, nout, device=g.device, dtype=torch.float32)
    name = "tn" + ("p" if prologue is not None else "") + ("m" if y is not None else "")
    pro = (None, None) if prologue is None else prologue
    launch(kernel("tall_gemm", f"mgg_tall_gemm_{name}_k{nt8}", g.device), g.device, grid, 32 * halves,
           (_p(g), _p(x), np.int64(n), np.int32(nout), np.int32(k), _p(partial), _p(pro[0]), _p(pro[1]),
            _p(y), _p(gm), _p(gsum)))
    if y is None:
        return partial.sum(0), None, None
    return partial.sum(0), gm, gsum.sum(0)
