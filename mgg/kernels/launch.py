"""Launching a kernel of mgg/kernels/*.cu: the module of the tensors' GPU, a grid, torch's stream.

A CUDA module and its function handles belong to one GPU's context, and a launch runs on a
stream of one GPU. Every launcher names the GPU its tensors live on; nothing here depends on
which GPU is current, so a process may call the kernels on any of its GPUs (a test suite does:
one test binds the NVSHMEM GPU, the next passes tensors of another).

    fn = kernel("norm_relu", "mgg_bn_relu_forward", x.device)
    launch(fn, x.device, blocks_for(n, THREADS, x.device, per_sm=8), THREADS, (args...))

`blocks_for` is the one grid rule of the grid-stride kernels: enough blocks for the work, at most
`per_sm` per SM (each launcher documents its own `per_sm`).
"""
from __future__ import annotations

import threading

import torch

from .streams import cuda_index, on_device

__all__ = ["cuda_index", "kernel", "sm_count", "blocks_for", "on_device", "launch", "float4_rows"]

_LOCK = threading.Lock()
_FUNCTIONS: dict[tuple[str, str, int, bool], object] = {}
_SMS: dict[int, int] = {}


def kernel(module: str, function: str, device: torch.device | int | None, nvshmem: bool = False):
    """The CuPy function `function` of mgg/kernels/<module>.cu on `device` (built and loaded once
    per GPU: mgg.kernels.build.load_module)."""
    idx = cuda_index(device)
    key = (module, function, idx, nvshmem)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        import cupy

        from .build import load_module

        mod = load_module(module, nvshmem=nvshmem, device=idx)
        with _LOCK, cupy.cuda.Device(idx):
            fn = _FUNCTIONS.setdefault(key, mod.get_function(function))
    return fn


def sm_count(device: torch.device | int | None) -> int:
    """Streaming multiprocessors of `device` (cached)."""
    idx = cuda_index(device)
    n = _SMS.get(idx)
    if n is None:
        n = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def blocks_for(units: int, per_block: int, device: torch.device | int | None, per_sm: int) -> int:
    """Blocks of a grid-stride launch over `units` (threads, warps or rows: the caller's unit),
    `per_block` of them a block: ceil(units / per_block), at most per_sm blocks per SM, at least 1."""
    return max(1, min(-(-int(units) // int(per_block)), sm_count(device) * int(per_sm)))


def launch(fn, device: torch.device | int | None, grid, block, args: tuple, shared_mem: int = 0) -> None:
    """fn<<<grid, block, shared_mem>>>(*args) on torch's current stream of `device` (grid and
    block: an int or a tuple)."""
    grid = grid if isinstance(grid, tuple) else (int(grid),)
    block = block if isinstance(block, tuple) else (int(block),)
    with on_device(device):
        fn(grid, block, args, shared_mem=shared_mem)


def float4_rows(t: torch.Tensor) -> torch.Tensor:
    """t contiguous with a 16-byte aligned start, for kernels that read its rows as float4s (a
    copy only when t is not already so)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()

