"""Launchers of mgg/kernels/embedding_bag.cu (NVSHMEM embedding-bag kernels).

Built as docs/embedding.md ("GPU path") describes: nvcc -rdc + device link against
libnvshmem_device.a into a cubin, cached on disk by source hash + arch (built once per node under
a file lock; see mgg.kernels.build), loaded on the table's GPU with
`nvshmem.bindings.cumodule_init` before the first launch (mgg.kernels.launch). Tensors are passed
as raw device pointers, launched on torch's current stream of their GPU: no host
synchronisation, nothing but the launch itself, so a lookup can be captured in a CUDA graph
(after one call outside the capture has loaded the module).

`lookup_bags(array, geometry, ids, offsets, ...)` -> one launch: checks, routes, reads and pools
one table's bags (inference), or only checks them (`out=None`, the training path);
`gather_rows(array, owner, local)` -> [U, D] rows (training path).
`array` is a SymmetricArray of the NVSHMEM store: `array.local` is a [rows_per_pe, D] view at the
symmetric address of this PE's slice, rows `stride(0)` floats apart (D padded to 16 bytes).

Every table has a status record in an int64 [T, STATUS_SLOTS] tensor on its GPU (`new_status`):
the kernel records there what was wrong with the input (ST_* slots, *_BIT flags) and counts the
rows it read and how many came from other PEs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .launch import blocks_for, kernel
from .streams import LaunchCache

__all__ = ["build", "gather_rows", "lookup_bags", "table_view", "TableGeometry", "new_status", "clear_status_errors",
           "MODES", "STATUS_SLOTS", "ST_FLAGS", "ST_LO", "ST_HI", "ST_DEC", "ST_FIRST", "ST_LAST", "ST_ROWS",
           "ST_REMOTE", "ID_RANGE_BIT", "FIRST_OFFSET_BIT", "DECREASING_BIT", "LAST_OFFSET_BIT"]

MODES = {"sum": 0, "mean": 1, "max": 2}
THREADS = 256
BLOCKS_PER_SM = 8  # grid-stride: one lane group per bag (lookup), one warp per row (gather)

# the status record of a table (embedding_bag.cu names the same slots)
STATUS_SLOTS = 8
ST_FLAGS, ST_LO, ST_HI, ST_DEC, ST_FIRST, ST_LAST, ST_ROWS, ST_REMOTE = range(STATUS_SLOTS)
ID_RANGE_BIT, FIRST_OFFSET_BIT, DECREASING_BIT, LAST_OFFSET_BIT = 1, 2, 4, 8
_NO_DEC = np.iinfo(np.int64).max
_CLEAN = (0, 0, 0, _NO_DEC, 0, 0)  # slots ST_FLAGS..ST_LAST of a record without errors


@dataclass(frozen=True)
class TableGeometry:
    """Where table t's rows are (mgg.embedding.sharding.TableLayout) and how its bags pool.

    Attributes:
        num_rows: N_t (valid ids are [0, N_t)).
        slice_rows: ceil(N_t / P), the rows of the table every PE reserves.
        base: the table's first local row in every PE's slice.
        hash: hash sharding (row g on PE g % world at base + g // world), else range sharding
            (row g on PE g // slice_rows at base + g % slice_rows).
        world: P.
        dim: D_t, the table's width (<= the array's width).
        mode: "sum", "mean" or "max".
    """

    num_rows: int
    slice_rows: int
    base: int
    hash: bool
    world: int
    dim: int
    mode: str


def build() -> str:
    """Compile embedding_bag.cu to a cubin (cached, see mgg.kernels.build); returns its path."""
    from .build import build_cubin

    return build_cubin("embedding_bag").path


_LAUNCH: dict[int, LaunchCache] = {}


def _launch_cache(dev: torch.device) -> LaunchCache:
    lc = _LAUNCH.get(dev.index)
    if lc is None:
        lc = _LAUNCH[dev.index] = LaunchCache(device=dev)
    return lc


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def table_view(array, what: str = "embedding lookup") -> torch.Tensor:
    """This PE's [rows_per_pe, D] view of the symmetric table: float32, unit column stride, rows
    `stride(0)` floats apart (the store pads D to 16 bytes, so the view is usually not contiguous).
    Valid until the array is freed; a lookup that runs many times takes it once."""
    table = array.local
    if table.dtype != torch.float32 or not table.is_cuda or table.stride(1) != 1 or table.stride(0) % 4:
        raise TypeError(f"{what}: the table must be a float32 CUDA tensor with unit column stride and rows "
                        f"of whole 16-byte vectors, got {table.dtype} on {table.device} with strides "
                        f"{tuple(table.stride())}")
    return table


def new_status(num_tables: int, device: torch.device) -> torch.Tensor:
    """int64 [num_tables, STATUS_SLOTS] status records without errors and with zero counters."""
    st = torch.zeros((num_tables, STATUS_SLOTS), dtype=torch.int64)
    st[:, ST_DEC] = _NO_DEC
    return st.to(device)


def clear_status_errors(status: torch.Tensor) -> None:
    """Reset the error slots of every record (the row counters stay)."""
    status[:, : ST_LAST + 1] = torch.tensor(_CLEAN, dtype=torch.int64).to(status.device)


def lookup_bags(table: torch.Tensor, geometry: TableGeometry, ids: torch.Tensor, offsets: torch.Tensor | None,
                bag_size: int, num_bags: int, per_sample_weights: torch.Tensor | None,
                status: torch.Tensor, out: torch.Tensor | None) -> None:
    """One launch of emb_bag_lookup on torch's current stream of the table's GPU.

    ids: int32 or int64 [n], contiguous, on the table's GPU (checked by the kernel, not here).
    offsets: int32 or int64 [R] contiguous on that GPU, or None for bags of `bag_size` ids.
    num_bags: B = R (the last bag ends at n) or R - 1 (include_last_offset: offsets[-1] ends it),
    or n / bag_size without offsets. per_sample_weights: float32 [n] contiguous, or None.
    status: this table's record, an int64 [STATUS_SLOTS] view. out: float32 [B, dim] contiguous
    (written), or None to check the input only. table: `table_view` of the symmetric array."""
    dev = table.device
    n = int(ids.numel())
    R = 0 if offsets is None else int(offsets.numel())
    if n == 0 and num_bags == 0:
        return
    fn = kernel("embedding_bag", "emb_bag_lookup", dev, nvshmem=True)
    D4 = (geometry.dim + 3) // 4
    lanes = 1
    while lanes < D4 and lanes < 32:
        lanes *= 2
    blocks = blocks_for(max(num_bags, 1) * lanes, THREADS, dev, BLOCKS_PER_SM)  # a lane group per bag
    with _launch_cache(dev).stream():
        fn((blocks,), (THREADS,),
           (_p(out), np.uint64(table.data_ptr()), np.int32(table.stride(0) // 4), np.int32(geometry.dim),
            _p(ids), np.int32(ids.dtype == torch.int64), np.int64(n),
            _p(offsets), np.int32(offsets is not None and offsets.dtype == torch.int64), np.int64(R),
            np.int64(num_bags), np.int64(bag_size), _p(per_sample_weights),
            np.int64(geometry.num_rows), np.int64(geometry.slice_rows), np.int64(geometry.base),
            np.int32(geometry.hash), np.int32(geometry.world), np.int32(MODES[geometry.mode]), _p(status)))


def gather_rows(array, owner, local) -> torch.Tensor:
    """Rows (owner[i], local[i]) of the symmetric table -> [U, D] on this GPU; owner[i] < 0 gives
    a zero row. owner, local: numpy arrays or tensors on the table's GPU (int32 / int64)."""
    table = table_view(array, "gather_rows")
    dev = table.device
    n, D = len(owner), table.shape[1]
    out = torch.empty((n, D), dtype=torch.float32, device=dev)
    if n == 0:
        return out
    ow = _on(dev, owner, torch.int32)
    lo = _on(dev, local, torch.int64)
    fn = kernel("embedding_bag", "emb_gather_rows", dev, nvshmem=True)
    blocks = blocks_for(n * 32, THREADS, dev, BLOCKS_PER_SM)
    with _launch_cache(dev).stream():
        fn((blocks,), (THREADS,), (_p(out), np.uint64(table.data_ptr()), _p(ow), _p(lo), np.int64(n), np.int32(D),
                                   np.int32(table.stride(0))))
    return out


_NUMPY = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


def _on(dev: torch.device, a, dtype: torch.dtype) -> torch.Tensor:
    """`a` (numpy array or tensor) as a contiguous `dtype` tensor on `dev` (no copy when it is one)."""
    if isinstance(a, torch.Tensor):
        return a.to(device=dev, dtype=dtype, non_blocking=True).contiguous()
    return torch.from_numpy(np.ascontiguousarray(a, dtype=_NUMPY[dtype])).to(dev)
