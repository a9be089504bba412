"""Launchers of mgg/kernels/sample.cu: GPU neighbor sampling, Fused-Map and the zero-copy gather.

The kernels are plain CUDA C, built once into a cubin (mgg.kernels.build, cached on disk) and
loaded per GPU (mgg.kernels.launch). Tensors are passed as raw pointers, so an argument may live in device memory or in pinned
host memory registered for device access (`cudaHostRegister` / `pin_memory()`): that is how the
sampler reads a CSR and the host tier reads features that do not fit the GPU budget.
All launches go to torch's current CUDA stream of the tensors' GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from .launch import blocks_for, kernel, launch

__all__ = ["sample_neighbors_cuda", "fused_map_cuda", "gather_host_rows_cuda", "THREADS"]

THREADS = 256
#: blocks per SM of the zero-copy gather: 8 warps, each lane 4 loads in flight (1-32 blocks/SM
#: measured the same 38-44 GB/s on H200; one leaves the most of every SM to compute)
HOST_GATHER_BLOCKS_PER_SM = 1


def _ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None or t.numel() == 0 else t.data_ptr())


def _launch(name: str, n_threads: int, args: tuple, device: torch.device, blocks_per_sm: int = 32) -> None:
    if n_threads <= 0:
        return
    launch(kernel("sample", name, device), device, blocks_for(n_threads, THREADS, device, blocks_per_sm), THREADS,
           args)


def sample_neighbors_cuda(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanout: int,
                          seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform sampling without replacement of min(deg, fanout) edge positions per seed.

    Args:
        indptr: int64 [N+1], indices: int64 [E] -- on the GPU or in pinned host memory.
        seeds: int64 [B] CUDA tensor of node ids. fanout: > 0, or -1 for all neighbors.
        seed: the random stream (same seed, same sample).
    Returns:
        (ptr int64 [B+1], nbr int64 [ptr[-1]]) on seeds' device.
    """
    dev = seeds.device
    seeds = seeds.to(torch.int64).contiguous()
    # degrees of the seeds (a pinned host CSR is indexed on the host; the kernel reads it in place)
    lo = indptr.index_select(0, seeds.to(indptr.device)).to(dev)
    hi = indptr.index_select(0, (seeds + 1).to(indptr.device)).to(dev)
    deg = hi - lo
    k = deg if fanout < 0 else torch.clamp(deg, max=int(fanout))
    ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(k, 0, out=ptr[1:])
    total = int(ptr[-1].item())
    nbr = torch.empty(total, dtype=torch.int64, device=dev)
    _launch("sample_uniform", seeds.numel(),
            (_ptr(indptr), _ptr(indices), _ptr(seeds), _ptr(ptr), np.int64(seeds.numel()),
             np.int32(fanout if fanout > 0 else 1 << 30), np.uint64(seed & (2 ** 64 - 1)), _ptr(nbr)), dev)
    return ptr, nbr


def fused_map_cuda(ids: torch.Tensor, n_seeds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicate ids and map each to its local index with one GPU hash-table pass (Fused-Map).

    Args:
        ids: int64 [n] CUDA tensor of global ids (>= 0); ids[:n_seeds] are the seeds (unique).
    Returns:
        (n_id int64 [U]: unique ids in first-occurrence order, seeds first;
         local int64 [n]: n_id[local] == ids).
    """
    dev = ids.device
    ids = ids.to(torch.int64).contiguous()
    n = ids.numel()
    if n == 0:
        return ids.clone(), ids.clone()
    cap = 1 << max(4, int(2 * n - 1).bit_length())   # power of two >= 2n: load factor <= 1/2
    keys = torch.full((cap,), -1, dtype=torch.int64, device=dev)   # 0xFF..F = EMPTY_KEY
    vals = torch.full((cap,), 2 ** 63 - 1, dtype=torch.int64, device=dev)
    first_pos = torch.empty(n, dtype=torch.int64, device=dev)
    is_first = torch.empty(n, dtype=torch.uint8, device=dev)
    args = (_ptr(ids), np.int64(n), _ptr(keys), _ptr(vals), np.int64(cap - 1))
    _launch("fused_map_insert", n, args, dev)
    _launch("fused_map_lookup", n, args + (_ptr(first_pos), _ptr(is_first)), dev)
    flag = is_first.to(torch.int64)
    lid = torch.cumsum(flag, 0) - 1          # local id of each first occurrence, in order
    n_id = ids[is_first.bool()]
    local = lid.index_select(0, first_pos)
    return n_id, local


def gather_host_rows_cuda(table: torch.Tensor, rows: torch.Tensor,
                          blocks_per_sm: int = HOST_GATHER_BLOCKS_PER_SM) -> torch.Tensor:
    """out[r] = table[rows[r]] read zero-copy with 128-byte-aligned warp accesses.

    Args:
        table: float32 [N, F] in pinned / cudaHostRegister-ed host memory (or on the GPU); rows
            contiguous in memory with stride table.stride(0).
        rows: int64 [R] CUDA tensor.
        blocks_per_sm: grid cap (256-thread blocks per SM); the default leaves most of each SM
            to kernels running beside the gather (bench/sampled.py measures the bandwidth).
    Returns:
        float32 [R, F] CUDA tensor.
    """
    if table.dtype != torch.float32 or table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(f"gather_host_rows_cuda: need a row-major float32 [N, F] table, got "
                         f"{table.dtype} {tuple(table.shape)} strides {table.stride()}")
    dev = rows.device
    rows = rows.to(torch.int64).contiguous()
    out = torch.empty((rows.numel(), table.shape[1]), dtype=torch.float32, device=dev)
    if rows.numel() and table.shape[1]:
        _launch("gather_rows_aligned", rows.numel() * 32,
                (_ptr(table), np.int64(table.stride(0)), np.int32(table.shape[1]), _ptr(rows),
                 np.int64(rows.numel()), _ptr(out)), dev, blocks_per_sm)
    return out
