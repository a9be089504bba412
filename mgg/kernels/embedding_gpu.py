"""Launcher of mgg/kernels/embedding_bag.cu (NVSHMEM embedding-bag kernels).

Built as docs/embedding.md ("GPU path") describes: nvcc -rdc + device link against
libnvshmem_device.a into a cubin, cached on disk by source hash + arch (built once per node under
a file lock; see mgg.kernels.build), loaded on the table's GPU with
`nvshmem.bindings.cumodule_init` before the first launch (mgg.kernels.launch). Tensors are passed
to cupy zero-copy through __cuda_array_interface__ on torch's current stream of that GPU. Tested against torch in float64 by
tests/embedding/test_embedding_gpu.py (P = 1 and 2, widths 1-70).

`gather_rows(array, owner, local)` -> [U, D] rows (training path);
`embedding_bag_fused(array, owner, local, offsets, psw, mode)` -> [B, D] pooled (inference).
`array` is a SymmetricArray of the NVSHMEM store: `array.local` is a [rows_per_pe, D] view at the
symmetric address of this PE's slice, rows `stride(0)` floats apart (D padded to 16 bytes).
"""
from __future__ import annotations

import numpy as np
import torch

from .launch import blocks_for, kernel, on_device

__all__ = ["build", "gather_rows", "embedding_bag_fused", "MODES"]

MODES = {"sum": 0, "mean": 1, "max": 2}
THREADS = 256
BLOCKS_PER_SM = 8  # grid-stride, one warp per row (gather) or per bag (fused)


def build() -> str:
    """Compile embedding_bag.cu to a cubin (cached, see mgg.kernels.build); returns its path."""
    from .build import build_cubin

    return build_cubin("embedding_bag").path


def _kernel(name: str, device: torch.device):
    return kernel("embedding_bag", name, device, nvshmem=True)


def _cp(t: torch.Tensor):
    import cupy

    return cupy.asarray(t)


def _grid(n_warps: int, device: torch.device) -> tuple[tuple[int], tuple[int]]:
    return (blocks_for(n_warps * 32, THREADS, device, BLOCKS_PER_SM),), (THREADS,)


def _table(array, what: str) -> torch.Tensor:
    """This PE's [rows_per_pe, D] view of the symmetric table: float32, unit column stride, rows
    `stride(0)` floats apart (the store pads D to 16 bytes, so the view is usually not contiguous)."""
    table = array.local
    if table.dtype != torch.float32 or not table.is_cuda or table.stride(1) != 1:
        raise TypeError(f"{what}: the table must be a float32 CUDA tensor with unit column stride, "
                        f"got {table.dtype} on {table.device} with strides {tuple(table.stride())}")
    return table


def gather_rows(array, owner: np.ndarray, local: np.ndarray) -> torch.Tensor:
    """Rows (owner[i], local[i]) of the symmetric table -> [U, D] on this GPU."""
    table = _table(array, "gather_rows")
    dev = table.device
    n, D = len(owner), table.shape[1]
    out = torch.empty((n, D), dtype=torch.float32, device=dev)
    if n == 0:
        return out
    ow = torch.from_numpy(np.ascontiguousarray(owner, dtype=np.int32)).to(dev, non_blocking=True)
    lo = torch.from_numpy(np.ascontiguousarray(local, dtype=np.int64)).to(dev, non_blocking=True)
    k_gather = _kernel("emb_gather_rows", dev)
    grid, block = _grid(n, dev)
    with on_device(dev):
        k_gather(grid, block, (_cp(out), np.uint64(table.data_ptr()), _cp(ow), _cp(lo), np.int64(n), np.int32(D),
                               np.int32(table.stride(0))))
    return out


_NUMPY = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


def _on(dev: torch.device, a, dtype: torch.dtype) -> torch.Tensor:
    """`a` (numpy array or tensor) as a contiguous `dtype` tensor on `dev` (no copy when it is one)."""
    if isinstance(a, torch.Tensor):
        return a.to(device=dev, dtype=dtype, non_blocking=True).contiguous()
    return torch.from_numpy(np.ascontiguousarray(a, dtype=_NUMPY[dtype])).to(dev)


def embedding_bag_fused(array, owner, local, offsets, per_sample_weights, mode: str) -> torch.Tensor:
    """Pooled bags [B, D]: offsets are [B + 1] (include_last_offset form), owner/local per index;
    each a numpy array or a tensor (ids already on this GPU are used in place)."""
    table = _table(array, "embedding_bag_fused")
    dev, D = table.device, table.shape[1]
    B = len(offsets) - 1
    out = torch.empty((B, D), dtype=torch.float32, device=dev)
    if B <= 0:
        return out
    ow, lo, off = _on(dev, owner, torch.int32), _on(dev, local, torch.int64), _on(dev, offsets, torch.int64)
    psw = None if per_sample_weights is None else _on(dev, per_sample_weights, torch.float32)
    k_bag = _kernel("emb_bag_fused", dev)
    grid, block = _grid(B, dev)
    smem = (block[0] // 32) * D * 4
    with on_device(dev):
        k_bag(grid, block, (_cp(out), np.uint64(table.data_ptr()), _cp(ow), _cp(lo), _cp(off),
                            _cp(psw) if psw is not None else np.uint64(0), np.int64(B), np.int32(D),
                            np.int32(table.stride(0)), np.int32(MODES[mode])), shared_mem=smem)
    return out
