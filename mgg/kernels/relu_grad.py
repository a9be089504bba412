"""Launcher of mgg/kernels/relu_grad.cu: a ReLU's backward and the bias gradient before it in
one pass.

For float32 CUDA rows g (the gradient of y = relu(x W^T + b)) and y, both [n, D],
`relu_backward_colsum(g, y)` returns (g', db): g' = g where y > 0, else 0 (torch's
threshold_backward(g, y, 0)), float32 [n, D], and db = the column sums of g', float32 [D] (per
-block partial sums, then their sum in a fixed order). torch runs these as two passes over g'
(mgg.nn.dense.linear_relu's backward). `supports(g)` says whether the kernel takes g (D = 4 d4,
d4 a power of two <= 256, as mgg.kernels.norm_relu). Built by mgg.kernels.build as a plain cubin
(no NVSHMEM), loaded with CuPy, launched on torch's current stream of g's GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from .launch import blocks_for, float4_rows, kernel, launch
from .norm_relu import supports

__all__ = ["supports", "relu_backward_colsum", "THREADS", "BLOCKS_PER_SM"]

THREADS = 256       # blockDim.x (the .cu's MGG_RELU_THREADS)
BLOCKS_PER_SM = 4   # grid = min(blocks of the work, 4 a SM): fewer partial rows to sum


def relu_backward_colsum(g: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g where y > 0 else 0, its column sums): g, y float32 CUDA [n, D] on one GPU -> float32
    [n, D] and float32 [D]."""
    if g.shape != y.shape or not supports(g) or y.dtype != torch.float32 or y.device != g.device:
        raise ValueError(f"relu_backward_colsum: expected float32 CUDA g and y of one shape [n, D] with "
                         f"D = 4 * 2^k <= 1024 on one GPU, got g {g.dtype} {tuple(g.shape)} on {g.device}, "
                         f"y {y.dtype} {tuple(y.shape)} on {y.device}")
    g, y = float4_rows(g), float4_rows(y)
    d = int(g.shape[1])
    out = torch.empty_like(g)
    n4 = g.numel() // 4
    if n4 == 0:
        return out, g.new_zeros(d)
    grid = blocks_for(n4, THREADS, g.device, BLOCKS_PER_SM)
    partial = torch.empty(grid, d, device=g.device, dtype=torch.float32)
    launch(kernel("relu_grad", "mgg_relu_backward_colsum", g.device), g.device, grid, THREADS,
           (np.uint64(g.data_ptr()), np.uint64(y.data_ptr()), np.uint64(out.data_ptr()),
            np.uint64(partial.data_ptr()), np.int64(n4), np.int32(d // 4)))
    return out, partial.sum(0)
