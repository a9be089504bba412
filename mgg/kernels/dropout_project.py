"""Launcher of mgg/kernels/dropout_project.cu: x [n, F] -> dropout(x) @ W^T and its weight
gradient, with the hash dropout regenerated in the kernels (the dropped x is never stored).

`supports(x, O)` says whether the fused kernels take a float32 CUDA x of this shape (F % 4 == 0,
F <= 256, O <= 32 with OT * ceil(F / 128) <= 32 -- the weight-gradient kernel's registers --,
16-byte aligned); `project_forward` and
`project_weight_grad` run them (p = 0: the plain projection). Built by mgg.kernels.build (plain
nvcc cubin, cached), launched on torch's current stream.
"""
from __future__ import annotations

import numpy as np
import torch

from .launch import blocks_for, float4_rows, kernel, on_device

__all__ = ["supports", "project_forward", "project_weight_grad", "FWD_THREADS", "FWD_BLOCKS_PER_SM", "WPB",
           "WGRAD_BLOCKS_PER_SM"]

FWD_THREADS = 256        # forward: threads per block (one row per thread)
FWD_BLOCKS_PER_SM = 8
WPB = 8                  # weight gradient: warps per block (DP_WPB of the .cu)
WGRAD_BLOCKS_PER_SM = 2  # fewer warps: fewer [F, O] partials to sum
WGRAD_TILE = {1: WPB * 8, 2: WPB * 4}  # rows per block tile by J = ceil(F / 128) (DP_R of the .cu)


def _ot(o: int) -> int:
    return 8 if o <= 8 else (16 if o <= 16 else 32)


def supports(x: torch.Tensor, out_features: int) -> bool:
    """Whether the fused kernels take x (float32 CUDA [n, F]) projected to `out_features`."""
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_cuda or not x.is_contiguous():
        return False
    f = int(x.shape[1])
    if f % 4 or f > 256 or not 1 <= out_features <= 32 or x.data_ptr() % 16:
        return False
    return _ot(out_features) * (-(-f // 128)) <= 32


def _fn(name: str, device: torch.device):
    return kernel("dropout_project", name, device)


def _args(p: float, seed) -> tuple:
    """(s1, s2, threshold, scale, drop, seed_ptr): keep when (hash >> 8) >= ceil(float32(p) 2^24),
    which is hash_uniform's u >= float32(p) exactly (u is a 24-bit integer over 2^24). `seed`: an
    int or a DeviceSeeds int64 CUDA tensor (mgg.kernels.dropout_gpu.seed_words)."""
    import math

    from .dropout_gpu import seed_words

    p32 = np.uint32(math.ceil(float(np.float32(p)) * (1 << 24)))
    scale = np.float32(1.0) / np.float32(1.0 - p) if p > 0 else np.float32(1.0)
    s1, s2, seed_ptr = seed_words(seed)
    return (s1, s2, p32, scale, np.int32(p > 0), seed_ptr)


def _blocks(dev: torch.device, per_sm: int, n: int, rows_per_block: int) -> int:
    return blocks_for(n, rows_per_block, dev, per_sm)


def _row_scale(row_scale: torch.Tensor | None, n: int, device: torch.device) -> np.uint64:
    """The kernels' row_scale pointer (0: none) after checking float32 [n] on `device`."""
    if row_scale is None:
        return np.uint64(0)
    if (row_scale.dtype != torch.float32 or row_scale.device != device or row_scale.dim() != 1
            or row_scale.shape[0] != n or not row_scale.is_contiguous()):
        raise TypeError(f"dropout_project: row_scale must be contiguous float32 [{n}] on {device}, got "
                        f"{row_scale.dtype} {tuple(row_scale.shape)} on {row_scale.device}")
    return np.uint64(row_scale.data_ptr())


def project_forward(x: torch.Tensor, weight: torch.Tensor, p: float, seed, row0: int,
                    keep_mask: bool = False, row_scale: torch.Tensor | None = None):
    """float32 [n, O]: dropout(x) @ weight^T, dropout keeping (row0 + r, c) when
    hash_uniform(row0 + r, c, seed) >= p (p = 0: no dropout). weight float32 [O, F].
    keep_mask (p > 0): also return the keep bits, uint32 [n, ceil(F / 32)] viewed as int32 (bit b
    of word w: column 32 w + b kept), for `project_weight_grad(..., mask=)`.
    row_scale: None or float32 [n]: output row r times row_scale[r] (in the kernel's store)."""
    n, f = x.shape
    rs = _row_scale(row_scale, n, x.device)
    o = int(weight.shape[0])
    w = weight.detach().to(torch.float32).contiguous()
    out = torch.empty((n, o), dtype=torch.float32, device=x.device)
    mask = None
    if keep_mask and p > 0:
        mask = torch.empty((n, -(-f // 32)), dtype=torch.int32, device=x.device)
    if n > 0:
        with on_device(x.device):
            _fn(f"mgg_dp_fwd_o{_ot(o)}", x.device)((_blocks(x.device, FWD_BLOCKS_PER_SM, n, FWD_THREADS),), (FWD_THREADS,), (
                np.uint64(x.data_ptr()), np.uint64(w.data_ptr()), np.uint64(out.data_ptr()),
                np.uint64(0 if mask is None else mask.data_ptr()), np.int64(n), np.int32(f), np.int32(o),
                np.int64(row0), *_args(p, seed), rs), shared_mem=f * _ot(o) * 4)
    return (out, mask) if keep_mask else out


def project_weight_grad(x: torch.Tensor, g: torch.Tensor, p: float, seed, row0: int,
                        mask: torch.Tensor | None = None, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [O, F]: g^T dropout(x) (the same dropout as project_forward), g float32 [n, O].
    mask: project_forward's keep bits for this x, p and seed (read instead of hashing again).
    row_scale: None or float32 [n]: row r of g read as row_scale[r] * g[r] (the weight gradient
    of project_forward(row_scale=))."""
    n, f = x.shape
    rs = _row_scale(row_scale, n, x.device)
    o = int(g.shape[1])
    g = g.to(torch.float32)
    g = float4_rows(g) if o % 4 == 0 else g.contiguous()  # the kernel reads rows of G as float4s
    if n == 0:
        return torch.zeros((o, f), dtype=torch.float32, device=x.device)
    if mask is not None and (p <= 0 or tuple(mask.shape) != (n, -(-f // 32)) or mask.dtype != torch.int32
                             or not mask.is_contiguous()):
        raise ValueError(f"project_weight_grad: mask must be project_forward's keep bits, int32 "
                         f"[{n}, {-(-f // 32)}] with p > 0; got {mask.dtype} {tuple(mask.shape)}, p={p}")
    j = -(-f // 128)
    blocks = _blocks(x.device, WGRAD_BLOCKS_PER_SM, n, WGRAD_TILE[j])
    partial = torch.empty((blocks * WPB, f, o), dtype=torch.float32, device=x.device)
    with on_device(x.device):
        _fn(f"mgg_dp_wgrad_o{_ot(o)}_j{j}", x.device)((blocks,), (32 * WPB,), (
            np.uint64(x.data_ptr()), np.uint64(g.data_ptr()), np.uint64(0 if mask is None else mask.data_ptr()),
            np.uint64(partial.data_ptr()), np.int64(n),
            np.int32(f), np.int32(o), np.int64(row0), *_args(p, seed), rs))
    return partial.sum(0).t()
