"""The hash dropout on the host, row block by row block: x * keep / (1 - p) (* row_scale).

The mask of (global row g, column c) is `hash_uniform_host(g, c, seed) >= p`, the one the CUDA
kernel draws (mgg.nn.functional.global_dropout). The forward writes its output one block of
rows at a time, and the backward draws the mask again from (seed, row0): between them nothing is
kept but the seed, and no whole-width temporary is made -- the host holds the input and the
output, plus one block's uniforms (ROWS_BLOCK_ELEMENTS of them). Drawn whole, the uniforms, the
mask as floats and two products were each as large as x, and the float mask stayed until the
backward (about 4x x's bytes at the peak).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["HashDropoutHost", "ROWS_BLOCK_ELEMENTS", "hash_uniform_host"]

_M32 = 0xFFFFFFFF

#: entries of one block of rows (its uint32 hash and float32 uniforms: 8 bytes each)
ROWS_BLOCK_ELEMENTS = 1 << 21


def _hash32_np(x: np.ndarray) -> np.ndarray:
    """`lowbias32` in place on a uint32 numpy array (numpy's uint32 arithmetic wraps mod 2^32)."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def hash_uniform_host(row0: int, n: int, cols: int, seed: int) -> torch.Tensor:
    """`hash_uniform(arange(row0, row0 + n), cols, seed)` bit for bit, on the host in uint32
    (4-byte in-place numpy ops: about as fast as torch.rand, ~7x faster than the int64 torch ops).

    Returns: float32 CPU tensor [n, cols].
    """
    s1, s2 = np.uint32(seed & _M32), np.uint32((seed >> 32) & _M32)
    rows = (np.arange(row0, row0 + n, dtype=np.uint64) & np.uint64(_M32)).astype(np.uint32)
    h_row = _hash32_np(rows ^ s1)
    col = np.arange(cols, dtype=np.uint32) * np.uint32(0x9E3779B1) + s2
    h = _hash32_np(h_row[:, None] ^ col[None, :])
    h >>= np.uint32(8)
    u = h.astype(np.float32)
    u *= np.float32(1.0 / (1 << 24))
    return torch.from_numpy(u)


def _blocks(n: int, cols: int):
    step = max(1, ROWS_BLOCK_ELEMENTS // max(1, cols))
    for a in range(0, n, step):
        yield a, min(n, a + step)


def _apply(src: torch.Tensor, p: float, seed: int, row0: int, row_scale: torch.Tensor | None,
           backward: bool) -> torch.Tensor:
    """src * keep / (1 - p) (* row_scale) block by block, in the order autograd of
    ``x * keep.to(dtype) / (1 - p) * row_scale[:, None]`` computes it: forward multiplies by the
    mask first, backward by row_scale first (so both are bit for bit the unblocked ops)."""
    out = torch.empty_like(src)
    cols = src.shape[1]
    for a, b in _blocks(src.shape[0], cols):
        keep = (hash_uniform_host(row0 + a, b - a, cols, seed) >= p).to(src.dtype)
        s = src[a:b]
        if backward:
            if row_scale is not None:
                s = s * row_scale[a:b].to(src.dtype).unsqueeze(1)
            torch.mul(s / (1.0 - p), keep, out=out[a:b])
        else:
            blk = s * keep / (1.0 - p)
            if row_scale is not None:
                blk = blk * row_scale[a:b].to(src.dtype).unsqueeze(1)
            out[a:b] = blk
    return out


class HashDropoutHost(torch.autograd.Function):
    """CPU x [n, D] (row i is global row row0 + i), p in (0, 1), a 62-bit int seed, row_scale None
    or a constant float [n] -> x * keep / (1 - p) (* row_scale[:, None]), x's dtype. The
    backward draws the mask again; only the seed and row_scale are kept."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed: int, row0: int,  # type: ignore[override]
                row_scale: torch.Tensor | None = None) -> torch.Tensor:
        ctx.p, ctx.seed, ctx.row0, ctx.row_scale = p, int(seed), int(row0), row_scale
        return _apply(x.detach().contiguous(), p, int(seed), int(row0), row_scale, backward=False)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        g = _apply(grad_out.contiguous(), ctx.p, ctx.seed, ctx.row0, ctx.row_scale, backward=True)
        return g, None, None, None, None
