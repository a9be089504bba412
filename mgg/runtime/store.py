"""Symmetric stores: one equal [rows_per_pe, D] slice per PE, read by others with one-sided gets.

`SymmetricStore` is the interface; `MPIStore` implements it with MPI-3 RMA windows
(`Win.Allocate`, passive target `Lock_all` / `Get` / `Flush`), `LocalStore` for a single process
without MPI. The NVSHMEM backend (GPU) lives in `mgg.runtime.nvshmem_store` and implements the
same interface over `nvshmem.core` symmetric memory. `mgg.graph.backends.make_store` (also
`mgg.runtime.make_store`) builds the store of a backend.

Protocol of one exchange (what `DistGraph.aggregate` does):
    arr.write(x)        # fill my slice (rows [0, n_local))
    arr.publish()       # make my slice visible to every PE (collective)
    rows = arr.get_rows(pe, row_ids)   # one-sided, from any PE, any number of times
    arr.release()       # collective: every PE is done reading; slices may be overwritten
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch

from ..knobs import STORAGE_DTYPE_NAMES
from .comm import Communicator

__all__ = ["SymmetricStore", "SymmetricArray", "MPIStore", "LocalStore", "cpu_store", "STORAGE_DTYPES",
           "storage_torch_dtype", "SIXTEEN_BIT"]

#: `--storage-dtype` names (mgg.knobs) -> the torch dtype embeddings are held in inside symmetric arrays
STORAGE_DTYPES = dict(zip(STORAGE_DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))
#: the 2-byte storage dtypes (rows are rounded to them on `write`, summed in float32 by readers)
SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def storage_torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `--storage-dtype` name ("fp32", "bf16", "fp16"); ValueError otherwise."""
    try:
        return STORAGE_DTYPES[name]
    except KeyError:
        raise ValueError(f"storage dtype must be one of {tuple(STORAGE_DTYPES)}, got {name!r}") from None

_MAX_ROWS_PER_GET = 1 << 20  # keep MPI counts and datatype sizes well inside int32


class SymmetricArray(abc.ABC):
    """A [rows_per_pe, dim] array with one slice on every PE."""

    rows_per_pe: int
    dim: int
    dtype: torch.dtype

    @property
    @abc.abstractmethod
    def local(self) -> torch.Tensor:
        """My slice, a tensor view [rows_per_pe, dim]."""

    def write(self, x: torch.Tensor) -> None:
        """Copy x ([n <= rows_per_pe, dim]) into the first n rows of my slice, converted to the
        array's dtype (float32 -> bfloat16 / float16 rounds to nearest even)."""
        if x.dim() != 2 or x.shape[1] != self.dim or x.shape[0] > self.rows_per_pe:
            raise ValueError(f"write: expected [<= {self.rows_per_pe}, {self.dim}], got {tuple(x.shape)}")
        self.local[: x.shape[0]].copy_(x)

    @abc.abstractmethod
    def publish(self) -> None:
        """Collective: local writes become visible to all PEs."""

    @abc.abstractmethod
    def release(self) -> None:
        """Collective: all PEs finished reading; slices may be written again."""

    @abc.abstractmethod
    def get_rows(self, pe: int, rows: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """One-sided get of rows `rows` (int64 [k]) of PE `pe`'s slice into `out` ([k, dim])."""

    def get_halo(self, halo_ptr: np.ndarray, halo_row: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Get rows from every PE: PE p's rows are halo_row[halo_ptr[p]:halo_ptr[p+1]].

        Returns [H, dim] in halo order. Backends may overlap the per-PE gets.
        """
        h = int(halo_row.shape[0])
        if out is None:
            out = torch.empty((h, self.dim), dtype=self.dtype, device=self.local.device)
        for pe in range(len(halo_ptr) - 1):
            a, b = int(halo_ptr[pe]), int(halo_ptr[pe + 1])
            if b > a:
                self.get_rows(pe, halo_row[a:b], out[a:b])
        return out

    @abc.abstractmethod
    def free(self) -> None:
        """Collective: release the memory on every PE."""


class SymmetricStore(abc.ABC):
    """Allocates symmetric arrays over a communicator."""

    comm: Communicator
    name: str = "abstract"

    @abc.abstractmethod
    def allocate(self, rows_per_pe: int, dim: int, dtype: torch.dtype = torch.float32) -> SymmetricArray:
        """Collective: a [rows_per_pe, dim] slice on every PE (same arguments on every PE)."""

    def barrier(self) -> None:
        self.comm.barrier()

    def allreduce_sum_(self, flat: torch.Tensor) -> bool:
        """Sum the 1-D float32 tensor `flat` over all ranks, in place, on the device it lives on,
        where the store can (collective). Returns False when it cannot (the caller then reduces
        on the host): this base store never can."""
        return False

    def close(self) -> None:
        """Free what the store itself holds (arrays are freed by their owners)."""


# ---------------------------------------------------------------------------------------------
# single process
@dataclass
class _LocalArray(SymmetricArray):
    rows_per_pe: int
    dim: int
    dtype: torch.dtype
    _buf: torch.Tensor

    @property
    def local(self) -> torch.Tensor:
        return self._buf

    def publish(self) -> None:
        pass

    def release(self) -> None:
        pass

    def get_rows(self, pe: int, rows: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        if pe != 0:
            raise IndexError(f"LocalStore has one PE; asked for PE {pe}")
        src = self._buf[torch.from_numpy(np.asarray(rows, dtype=np.int64))]
        if out is None:
            return src
        out.copy_(src)
        return out

    def free(self) -> None:
        self._buf = torch.empty(0)


class LocalStore(SymmetricStore):
    """One PE, no MPI: slices are ordinary tensors."""

    name = "local"

    def __init__(self, comm: Communicator, device: torch.device | str = "cpu"):
        if comm.size != 1:
            raise ValueError("LocalStore needs a single-process communicator")
        self.comm = comm
        self.device = torch.device(device)

    def allocate(self, rows_per_pe: int, dim: int, dtype: torch.dtype = torch.float32) -> SymmetricArray:
        return _LocalArray(rows_per_pe, dim, dtype,
                           torch.zeros((rows_per_pe, dim), dtype=dtype, device=self.device))


# ---------------------------------------------------------------------------------------------
# MPI one-sided windows
#: torch dtype -> numpy dtype of the window's elements. bfloat16 has no numpy dtype: its raw bits
#: travel as uint16 (MPI moves bytes; nothing in the window does arithmetic) and the torch side
#: views them as bfloat16. float16 has one, but rides the same way for symmetry.
_TORCH_TO_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
                torch.int32: np.int32, torch.bfloat16: np.uint16, torch.float16: np.uint16}


def _as_window_view(t: torch.Tensor, npdt: np.dtype) -> np.ndarray:
    """The numpy view of tensor `t` with the window's element type (raw bits for 16-bit floats)."""
    if t.dtype in SIXTEEN_BIT:
        return t.view(torch.int16).numpy().view(npdt)
    return t.numpy()


class _MPIArray(SymmetricArray):
    """A window of rows_per_pe * dim elements per rank, locked (passive target) for its lifetime."""

    def __init__(self, comm: Communicator, rows_per_pe: int, dim: int, dtype: torch.dtype):
        from mpi4py import MPI

        if dtype not in _TORCH_TO_NP:
            raise TypeError(f"MPIStore: unsupported dtype {dtype}")
        self.comm, self.rows_per_pe, self.dim, self.dtype = comm, rows_per_pe, dim, dtype
        npdt = np.dtype(_TORCH_TO_NP[dtype])
        self._mpi_elem = MPI._typedict[npdt.char]
        nbytes = max(1, rows_per_pe * dim) * npdt.itemsize
        self._win = MPI.Win.Allocate(nbytes, npdt.itemsize, comm=comm.comm)
        self._npdt = npdt
        mem = np.frombuffer(self._win.tomemory(), dtype=npdt)[: rows_per_pe * dim]
        self._np = mem.reshape(rows_per_pe, dim)
        self._tensor = torch.from_numpy(self._np)
        if dtype in SIXTEEN_BIT:  # the window holds the raw 16 bits; torch sees the float type
            self._tensor = self._tensor.view(dtype)
        self._tensor.zero_()
        self._row_type = self._mpi_elem.Create_contiguous(max(dim, 1)).Commit()
        self._win.Lock_all(MPI.MODE_NOCHECK)
        comm.barrier()

    @property
    def local(self) -> torch.Tensor:
        return self._tensor

    def publish(self) -> None:
        self._win.Sync()  # local stores -> public window copy
        self.comm.barrier()

    def release(self) -> None:
        self.comm.barrier()

    def _get_into(self, pe: int, rows: np.ndarray, out_np: np.ndarray) -> None:
        for a in range(0, len(rows), _MAX_ROWS_PER_GET):
            chunk = np.ascontiguousarray(rows[a: a + _MAX_ROWS_PER_GET], dtype=np.int32)
            k = len(chunk)
            # contiguous runs are common (halo rows are sorted): an indexed-block datatype of rows
            ttype = self._row_type.Create_indexed_block(1, chunk).Commit()
            try:
                self._win.Get([out_np[a: a + k], k * self.dim, self._mpi_elem], pe, [0, 1, ttype])
            finally:
                ttype.Free()

    def get_rows(self, pe: int, rows: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows_per_pe):
            raise IndexError(f"get_rows: row ids out of [0, {self.rows_per_pe}) for PE {pe}")
        if out is None:
            out = torch.empty((len(rows), self.dim), dtype=self.dtype)
        if out.dtype != self.dtype:
            raise TypeError(f"get_rows: out is {out.dtype}, the array holds {self.dtype}")
        if len(rows) == 0:
            return out
        out_np = _as_window_view(out, self._npdt)
        if not out_np.flags.c_contiguous:
            raise ValueError("get_rows: out must be C-contiguous")
        self._get_into(pe, rows, out_np)
        self._win.Flush(pe)
        return out

    def get_halo(self, halo_ptr: np.ndarray, halo_row: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """All per-PE gets are issued before one Flush_all, so transfers from PEs overlap."""
        h = int(halo_row.shape[0])
        if out is None:
            out = torch.empty((h, self.dim), dtype=self.dtype)
        if out.dtype != self.dtype:
            raise TypeError(f"get_halo: out is {out.dtype}, the array holds {self.dtype}")
        out_np = _as_window_view(out, self._npdt)
        for pe in range(len(halo_ptr) - 1):
            a, b = int(halo_ptr[pe]), int(halo_ptr[pe + 1])
            if b > a:
                self._get_into(pe, np.asarray(halo_row[a:b]), out_np[a:b])
        self._win.Flush_all()
        return out

    def free(self) -> None:
        if self._win is None:
            return
        self.comm.barrier()
        self._win.Unlock_all()
        self._row_type.Free()
        self._tensor = self._np = None
        self._win.Free()
        self._win = None


class MPIStore(SymmetricStore):
    """Symmetric memory over MPI-3 RMA windows (CPU)."""

    name = "mpi"

    def __init__(self, comm: Communicator):
        if comm.comm is None:
            raise ValueError("MPIStore needs an MPI communicator")
        self.comm = comm

    def allocate(self, rows_per_pe: int, dim: int, dtype: torch.dtype = torch.float32) -> SymmetricArray:
        return _MPIArray(self.comm, rows_per_pe, dim, dtype)


def cpu_store(comm: Communicator) -> SymmetricStore:
    """The CPU store of `comm`: MPI RMA windows, or a LocalStore without MPI."""
    return LocalStore(comm) if comm.comm is None else MPIStore(comm)
