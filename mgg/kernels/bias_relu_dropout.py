"""Launchers of mgg/kernels/bias_relu_dropout.cu: a hidden layer's bias, ReLU and the next layer's
input dropout (and input row scale), one pass forward and one backward.

For float32 CUDA rows a [n, D] (an aggregation's output before its bias):

* `brd_forward(a, bias, p, seed, row0, row_scale)` = ((relu(a + bias) * keep) * scale) * row_scale
  per row: float32 [n, D], the same bits as torch's add and relu followed by
  mgg.kernels.dropout_gpu.dropout_hash_cuda (keep: the hash mask of global rows row0 .., seed;
  scale = float32(1 / float32(1 - p))); p = 0: no dropout.
* `brd_backward(g, a, bias, p, seed, row0, row_scale, out_scale)` = (g' * out_scale per row, db):
  g' = the gradient with respect to a + bias of the forward given g = d loss / d out (the dropout
  and ReLU masks regenerated from the seed and from a), db its column sums (the bias gradient).
  out_scale folds the column factor of the aggregation that produced a into the table its
  transposed call reads (`aggregate(.., scaled_input=True)`: no pre-scale pass there).

`supports(a)`: D = 4 d4 with d4 a power of two <= 256 (as mgg.kernels.norm_relu). Built by
mgg.kernels.build as a plain cubin (no NVSHMEM), launched on torch's current stream of a's GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from .dropout_gpu import seed_words
from .launch import blocks_for, float4_rows, kernel, launch
from .norm_relu import supports

__all__ = ["supports", "brd_forward", "brd_backward", "THREADS", "BLOCKS_PER_SM"]

THREADS = 256       # blockDim.x (the .cu's MGG_BRD_THREADS)
BLOCKS_PER_SM = 4   # grid = min(blocks of the work, 4 a SM): the backward's partial rows stay few


def _check(a: torch.Tensor, p: float, name: str = "a", **vectors) -> None:
    """a float32 CUDA [n, D] the kernels take, p in [0, 1), and each of `vectors` (bias: [D];
    row_scale, out_scale: [n]) None or float32 of that shape on a's GPU; else a ValueError naming it."""
    if not supports(a):
        raise ValueError(f"bias_relu_dropout: {name} must be float32 CUDA [n, D] with D = 4 * 2^k <= 1024, got "
                         f"{a.dtype} {tuple(a.shape)} on {a.device}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"bias_relu_dropout: p must be in [0, 1), got {p}")
    n, d = a.shape
    for what, v in vectors.items():
        want = d if what == "bias" else n
        if v is not None and (v.dtype != torch.float32 or v.device != a.device or tuple(v.shape) != (want,)):
            raise ValueError(f"bias_relu_dropout: {what} must be float32 [{want}] on {a.device}, got "
                             f"{v.dtype} {tuple(v.shape)} on {v.device}")


def _common(a: torch.Tensor, bias, p: float, seed, row0: int, row_scale) -> tuple:
    """(grid, the kernel arguments from n4 through row_scale, tensors to keep alive)."""
    n, d = a.shape
    n4, d4 = n * d // 4, d // 4
    drop = p > 0.0
    s1, s2, seed_ptr = seed_words(seed) if drop else (np.uint32(0), np.uint32(0), np.uint64(0))
    scale = np.float32(1.0) / np.float32(1.0 - p) if drop else np.float32(1.0)
    bias_c = None if bias is None else bias.contiguous()
    rs_c = None if row_scale is None else row_scale.contiguous()
    args = (np.int64(n4), np.int32(d4.bit_length() - 1), np.int64(row0), s1, s2, np.float32(p), scale,
            np.int32(drop), seed_ptr, np.uint64(0 if rs_c is None else rs_c.data_ptr()))
    return blocks_for(n4, THREADS, a.device, BLOCKS_PER_SM), args, bias_c, rs_c


def brd_forward(a: torch.Tensor, bias: torch.Tensor | None, p: float, seed, row0: int,
                row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """((relu(a + bias) * keep) * scale) * row_scale: a float32 CUDA [n, D] -> float32 [n, D].

    bias: float32 [D] or None (no add). p in [0, 1) (0: no dropout, seed unused). seed: as
    dropout_hash_cuda's (an int, or a DeviceSeeds int64 CUDA tensor). row0: the global id of row 0.
    row_scale: float32 [n] or None."""
    _check(a, p, bias=bias, row_scale=row_scale)
    a = float4_rows(a)
    out = torch.empty_like(a)
    if a.numel() == 0:
        return out
    grid, args, bias_c, rs_c = _common(a, bias, p, seed, row0, row_scale)
    launch(kernel("bias_relu_dropout", "mgg_brd_forward", a.device), a.device, grid, THREADS,
           (np.uint64(a.data_ptr()), np.uint64(0 if bias_c is None else bias_c.data_ptr()),
            np.uint64(out.data_ptr())) + args)
    return out


def brd_backward(g: torch.Tensor, a: torch.Tensor, bias: torch.Tensor | None, p: float, seed, row0: int,
                 row_scale: torch.Tensor | None = None,
                 out_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(g' * out_scale per row, column sums of g'): g = d loss / d brd_forward(a, ...) and a, float32
    CUDA [n, D] -> float32 [n, D], float32 [D]. out_scale: float32 [n] or None."""
    _check(a, p, bias=bias, row_scale=row_scale, out_scale=out_scale)
    _check(g, p, "g")
    if g.shape != a.shape or g.device != a.device:
        raise ValueError(f"bias_relu_dropout: g {tuple(g.shape)} on {g.device} must match a {tuple(a.shape)} on {a.device}")
    g, a = float4_rows(g), float4_rows(a)
    d = int(a.shape[1])
    gout = torch.empty_like(g)
    if a.numel() == 0:
        return gout, g.new_zeros(d)
    grid, args, bias_c, rs_c = _common(a, bias, p, seed, row0, row_scale)
    os_c = None if out_scale is None else out_scale.contiguous()
    partial = torch.empty(grid, d, device=g.device, dtype=torch.float32)
    launch(kernel("bias_relu_dropout", "mgg_brd_backward", a.device), a.device, grid, THREADS,
           (np.uint64(g.data_ptr()), np.uint64(a.data_ptr()), np.uint64(0 if bias_c is None else bias_c.data_ptr()),
            np.uint64(gout.data_ptr()), np.uint64(partial.data_ptr())) + args
           + (np.uint64(0 if os_c is None else os_c.data_ptr()),))
    return gout, partial.sum(0)
