"""Launchers of mgg/kernels/block_sum.cu: a sampled block's row sums with dropout and scales folded in.

For a block in CSR (ptr int64 [n_dst + 1], col int64 [E], local src ids) and float32 CUDA rows:

* `block_sum_cuda(x, ptr, col, ...)`: out float32 [n_dst, F],
  out[i] = dst_scale[i] * sum_k src_scale[col[k]] * drop(x)[col[k]] -- one pass over the edges,
  no [E, F] message tensor;
  with `src_index` (int64 [n_src]) x is a table [N, F] and src j's row is x[src_index[j]];
  with `x_addr` (int64 [1] on the GPU) the table is at the address stored there, read by the
  kernel (x then only gives the width, dtype and device);
* `block_sum_grad_cuda(g, ptr, col, n_src, ...)`: grad_x float32 [n_src, F], its transpose.

drop(x) is the hash dropout of x's rows numbered from 0 (mgg.nn.functional.seeded_dropout(x, p,
seed, 0) draws the same mask); `seed` is a 62-bit int or an int64 CUDA tensor (a device seed,
see mgg.kernels.dropout_gpu.seed_words). Built by mgg.kernels.build as a plain cubin (no
NVSHMEM), launched on torch's current stream of the tensors' GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from .dropout_gpu import seed_words
from .launch import blocks_for, kernel, launch

__all__ = ["block_sum_cuda", "block_sum_grad_cuda", "THREADS", "BLOCKS_PER_SM"]

THREADS = 256        # 8 warps, one dst row each at a time
BLOCKS_PER_SM = 16   # 128 warps a SM: enough rows in flight to hide the random row reads


def _ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def _scale(v: torch.Tensor | None, n: int, device: torch.device, name: str) -> torch.Tensor | None:
    if v is None:
        return None
    v = v.detach().to(device=device, dtype=torch.float32).contiguous()
    if v.shape != (n,):
        raise ValueError(f"block_sum: {name} must have shape ({n},), got {tuple(v.shape)}")
    return v


def _args(ptr: torch.Tensor, col: torch.Tensor, n_dst: int, n_src: int, src_scale, dst_scale,
          p: float, seed, device: torch.device) -> tuple:
    """The launch arguments shared by both kernels after the data pointer and width."""
    if ptr.dtype != torch.int64 or col.dtype != torch.int64 or ptr.device != device or col.device != device:
        raise TypeError(f"block_sum: ptr and col must be int64 tensors on {device}, got {ptr.dtype} on "
                        f"{ptr.device} and {col.dtype} on {col.device}")
    if ptr.shape != (n_dst + 1,):
        raise ValueError(f"block_sum: ptr must have shape ({n_dst + 1},), got {tuple(ptr.shape)}")
    drop_on = seed is not None and p > 0.0
    if drop_on and not p < 1.0:
        raise ValueError(f"block_sum: dropout p must be in [0, 1), got {p}")
    s1, s2, seed_ptr = seed_words(seed) if drop_on else (np.uint32(0), np.uint32(0), np.uint64(0))
    scale = np.float32(1.0) / np.float32(1.0 - p) if drop_on else np.float32(1.0)
    src = _scale(src_scale, n_src, device, "src_scale")
    dst = _scale(dst_scale, n_dst, device, "dst_scale")
    ptr, col = ptr.contiguous(), col.contiguous()
    keep = (ptr, col, src, dst)  # alive until the launch is queued
    return keep, (_ptr(ptr), _ptr(col), np.int64(n_dst), _ptr(src), _ptr(dst), s1, s2,
                  np.float32(p if drop_on else 0.0), scale, np.int32(drop_on), seed_ptr)


def _vec4(dim: int, *tensors: torch.Tensor) -> np.int32:
    return np.int32(dim % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in tensors))


def block_sum_cuda(x: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor, n_dst: int,
                   src_scale: torch.Tensor | None = None, dst_scale: torch.Tensor | None = None,
                   p: float = 0.0, seed=None, src_index: torch.Tensor | None = None,
                   x_addr: torch.Tensor | None = None) -> torch.Tensor:
    """float32 CUDA x [n_src, F] -> [n_dst, F]: the block's row sums (module doc).

    Args:
        x: float32 [n_src, F] on the GPU (made contiguous); with `src_index`, a table [N, F]
            whose row src_index[j] is src j's (ids < N: not checked here). ptr: int64
            [n_dst + 1], col: int64 [E] local src ids < n_src, both on x's GPU. src_scale:
            float32 [n_src] or None. dst_scale: float32 [n_dst] or None. p, seed: the dropout of
            the src rows, numbered by j (seed None or p == 0: none). src_index: int64 [n_src] on
            x's GPU, or None. x_addr: int64 [1] on x's GPU holding the address of a contiguous,
            16-byte aligned float32 [N, F] table (rows past those src_index reaches are never
            read), or None; requires src_index.
    """
    if x.dtype != torch.float32 or not x.is_cuda or x.dim() != 2:
        raise TypeError(f"block_sum_cuda: expected a float32 CUDA [n, F] tensor, got {x.dtype} "
                        f"{tuple(x.shape)} on {x.device}")
    x = x.contiguous()
    dim = int(x.shape[1])
    n_src = int(x.shape[0])
    if x_addr is not None:
        if src_index is None:
            raise ValueError("block_sum_cuda: a table at x_addr is read through src_index; give both")
        if x_addr.dtype != torch.int64 or x_addr.device != x.device or x_addr.numel() != 1:
            raise TypeError(f"block_sum_cuda: x_addr must be one int64 on {x.device}, got {x_addr.dtype} "
                            f"{tuple(x_addr.shape)} on {x_addr.device}")
    if src_index is not None:
        if src_index.dtype != torch.int64 or src_index.device != x.device or src_index.dim() != 1:
            raise TypeError(f"block_sum_cuda: src_index must be a 1-D int64 tensor on {x.device}, got "
                            f"{src_index.dtype} {tuple(src_index.shape)} on {src_index.device}")
        src_index = src_index.contiguous()
        n_src = int(src_index.numel())
    keep, args = _args(ptr, col, n_dst, n_src, src_scale, dst_scale, p, seed, x.device)
    out = torch.empty((n_dst, dim), dtype=torch.float32, device=x.device)
    if n_dst and dim:
        launch(kernel("block_sum", "mgg_block_sum", x.device), x.device,
               blocks_for(n_dst, THREADS // 32, x.device, BLOCKS_PER_SM), THREADS,
               (_ptr(x), np.int32(dim)) + args[:3] + (_ptr(src_index), _ptr(x_addr)) + args[3:]
               + (_vec4(dim, x, out) if x_addr is None else np.int32(dim % 4 == 0), _ptr(out)))
    del keep, src_index
    return out


def block_sum_grad_cuda(g: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor, n_src: int,
                        src_scale: torch.Tensor | None = None, dst_scale: torch.Tensor | None = None,
                        p: float = 0.0, seed=None) -> torch.Tensor:
    """The gradient of `block_sum_cuda` with respect to x: g float32 CUDA [n_dst, F] -> [n_src, F]
    (same block, scales and dropout as the forward)."""
    if g.dtype != torch.float32 or not g.is_cuda or g.dim() != 2:
        raise TypeError(f"block_sum_grad_cuda: expected a float32 CUDA [n, F] tensor, got {g.dtype} "
                        f"{tuple(g.shape)} on {g.device}")
    g = g.contiguous()
    n_dst, dim = int(g.shape[0]), int(g.shape[1])
    keep, args = _args(ptr, col, n_dst, n_src, src_scale, dst_scale, p, seed, g.device)
    grad_x = torch.zeros((n_src, dim), dtype=torch.float32, device=g.device)
    if n_dst and dim and col.numel():
        launch(kernel("block_sum", "mgg_block_sum_grad", g.device), g.device,
               blocks_for(n_dst, THREADS // 32, g.device, BLOCKS_PER_SM), THREADS,
               (_ptr(g), np.int32(dim)) + args + (_vec4(dim, g, grad_x), _ptr(grad_x)))
    del keep
    return grad_x
