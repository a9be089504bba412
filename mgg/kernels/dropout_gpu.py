"""Launcher of mgg/kernels/dropout.cu: fused counter-hash dropout on the GPU (no mask stored).

`dropout_hash_cuda(x, p, seed, row0)` returns x * keep / (1 - p) where keep of (global row
row0 + i, column c) is `mgg.nn.functional.hash_uniform(row, c, seed) >= p` bit for bit; the
backward of dropout is the same call on the gradient (same seed, same rows). Built by
mgg.kernels.build (plain nvcc cubin: the kernel calls no NVSHMEM, so no device link and no
`cumodule_init`), cached on disk, loaded per GPU and launched on torch's current stream of x's GPU (mgg.kernels.launch).
"""
from __future__ import annotations

import numpy as np
import torch

from .launch import blocks_for, kernel, launch

__all__ = ["build", "dropout_hash_cuda", "seed_words", "THREADS", "BLOCKS_PER_SM"]

THREADS = 256
BLOCKS_PER_SM = 32


def build(arch: str | None = None) -> str:
    """Compile dropout.cu to a cubin (cached, see mgg.kernels.build); returns its path."""
    from .build import build_cubin

    return build_cubin("dropout", arch, nvshmem=False).path


def seed_words(seed) -> tuple[np.uint32, np.uint32, np.uint64]:
    """(s1, s2, seed_ptr) kernel arguments of a dropout seed: a 64-bit non-negative int (s1 its
    low and s2 its high 32 bits, seed_ptr 0), or an int64 CUDA tensor (mgg.nn.functional.
    DeviceSeeds): the kernels then read element 0 and use mix_seed(value) (s1 = s2 = 0 unused)."""
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64 or not seed.is_cuda or seed.numel() < 1:
            raise TypeError(f"dropout seed: expected an int or an int64 CUDA tensor, got {seed.dtype} "
                            f"{tuple(seed.shape)} on {seed.device}")
        return np.uint32(0), np.uint32(0), np.uint64(seed.data_ptr())
    seed = int(seed)
    return np.uint32(seed & 0xFFFFFFFF), np.uint32((seed >> 32) & 0xFFFFFFFF), np.uint64(0)


def dropout_hash_cuda(x: torch.Tensor, p: float, seed, row0: int,
                      row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """float32 CUDA [n, D] -> [n, D]: x * (hash_uniform(row0 + i, c, seed) >= p) / (1 - p)
    (then * row_scale[i] per row, in the same pass, when given).

    Args:
        x: float32 CUDA tensor [n, D] (made contiguous). p: drop probability in (0, 1).
        seed: 64-bit non-negative int, or an int64 CUDA tensor whose element 0 is a DeviceSeeds
            counter c (the seed is then mix_seed(c), read on the GPU). row0: global id of row 0 (>= 0).
        row_scale: None or float32 [n] on x's GPU.
    """
    if x.dtype != torch.float32 or not x.is_cuda or x.dim() != 2:
        raise TypeError(f"dropout_hash_cuda: expected a float32 CUDA [n, D] tensor, got {x.dtype} "
                        f"{tuple(x.shape)} on {x.device}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"dropout_hash_cuda: p must be in (0, 1), got {p}")
    if row_scale is not None:
        if (row_scale.dtype != torch.float32 or row_scale.device != x.device or row_scale.dim() != 1
                or row_scale.shape[0] != x.shape[0]):
            raise TypeError(f"dropout_hash_cuda: row_scale must be float32 [{x.shape[0]}] on {x.device}, got "
                            f"{row_scale.dtype} {tuple(row_scale.shape)} on {row_scale.device}")
        row_scale = row_scale.contiguous()
    x = x.contiguous()
    out = torch.empty_like(x)
    n, d = x.shape
    groups = n * (-(-d // 4))
    if groups == 0:
        return out
    vec4 = int(d % 4 == 0 and x.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0)
    p32 = np.float32(p)  # torch compares the float32 uniforms with p cast to float32
    scale = np.float32(1.0) / np.float32(1.0 - p)  # torch CUDA: x * (1 / float32(1 - p))
    blocks = blocks_for(groups, THREADS, x.device, BLOCKS_PER_SM)
    s1, s2, seed_ptr = seed_words(seed)
    launch(kernel("dropout", "mgg_dropout", x.device), x.device, blocks, THREADS,
           (np.uint64(x.data_ptr()), np.uint64(out.data_ptr()), np.int64(n), np.int32(d), np.int64(row0),
            s1, s2, p32, scale, np.int32(vec4), seed_ptr,
            np.uint64(0 if row_scale is None else row_scale.data_ptr())))
    return out
