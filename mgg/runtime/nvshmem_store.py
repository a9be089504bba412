"""The NVSHMEM backend of SymmetricStore (GPU).

NVSHMEM is initialised from the MPI communicator through nvshmem4py, on the GPU chosen by the
node-local rank. Every symmetric array is one NVSHMEM allocation of [rows_per_pe, Dp] per PE in
its dtype: float32 with Dp = D rounded up to a multiple of 4, or a 16-bit storage dtype
(bfloat16 / float16, docs/storage-dtype.md) with Dp = D rounded up to a multiple of 8, so that
each row starts on a 16-byte boundary (the kernels read rows as 16-byte vectors: a float4, or 8
16-bit elements); `local` is the [rows_per_pe, D] view, `vecs` the 16-byte vectors per row. `publish` and `release` are
NVSHMEM barriers on the current CUDA stream, so they order the kernels before and after them
without a host synchronisation.

Reading other PEs' rows (`get_halo` / `get_rows`) runs a gather kernel, which the store does not
own: it is handed in as `gather_rows` by the factory one layer up (`mgg.graph.backends.make_store`,
which passes mgg.kernels.gpu.halo_gather), so the store never imports the kernels.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
import threading
from typing import Callable

import numpy as np
import torch


from .comm import Communicator
from .gpu_assignment import device_index
from .layout import padded_dim
from .store import SymmetricArray, SymmetricStore
from .stream_ref import StreamRef

__all__ = ["NvshmemStore", "RowGather", "padded_dim", "padded_width", "NVSHMEM_DTYPES", "FINALIZE_TIMEOUT_S"]

#: seconds NVSHMEM's finalize at exit may take before the rank aborts the job with a message
FINALIZE_TIMEOUT_S = 120.0

#: element types a symmetric array may hold: float32, and the 16-bit storage dtypes
NVSHMEM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def padded_width(dim: int, dtype: torch.dtype) -> int:
    """Row length in elements of a [*, dim] array of `dtype` in symmetric memory: a whole number
    of 16-byte vectors (4 float32 or 8 16-bit elements), at least one."""
    if dtype == torch.float32:
        return padded_dim(dim)
    return max(8, (int(dim) + 7) // 8 * 8)

#: (array, pe int32 [k], rows int32 [k], numpy arrays or tensors on the array's GPU) -> [k, array.dim]
#: of array.dtype on the GPU: row rows[i]
#: of PE pe[i]'s slice of the symmetric array (a kernel launch on torch's current stream)
RowGather = Callable[["_NvshmemArray", "np.ndarray | torch.Tensor", "np.ndarray | torch.Tensor"], torch.Tensor]


class _NvshmemArray(SymmetricArray):
    def __init__(self, store: "NvshmemStore", rows_per_pe: int, dim: int, dtype: torch.dtype):
        import nvshmem.core as nvshmem

        if dtype not in NVSHMEM_DTYPES:
            raise TypeError(f"NvshmemStore: supported dtypes are {NVSHMEM_DTYPES}, got {dtype}")
        self.store, self.rows_per_pe, self.dim, self.dtype = store, rows_per_pe, dim, dtype
        self.dim_padded = padded_width(dim, dtype)
        #: 16-byte vectors per row (the kernels' D4 / DV)
        self.vecs = self.dim_padded * torch.finfo(dtype).bits // 128
        store.quiesce()
        self.padded = nvshmem.tensor((max(1, rows_per_pe), self.dim_padded), dtype=dtype)
        self.padded.zero_()
        store.quiesce()  # every PE's slice zeroed before any PE reads it

    @property
    def local(self) -> torch.Tensor:
        return self.padded[: self.rows_per_pe, : self.dim]

    @property
    def data_ptr(self) -> int:
        """The symmetric address of this PE's slice (the same offset on every PE)."""
        return int(self.padded.data_ptr())

    def _barrier(self) -> None:
        import nvshmem.core as nvshmem

        nvshmem.barrier_all(stream=StreamRef(torch.cuda.current_stream().cuda_stream))

    def publish(self) -> None:
        self._barrier()

    def release(self) -> None:
        self._barrier()

    def get_halo(self, halo_ptr: np.ndarray, halo_row: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        gather = self.store.gather_rows
        if gather is None:
            raise RuntimeError("NvshmemStore has no row-gather kernel: build it with "
                               "mgg.runtime.make_store(comm, 'gpu') or pass gather_rows=")
        pe = np.repeat(np.arange(len(halo_ptr) - 1, dtype=np.int32), np.diff(halo_ptr))
        rows = gather(self, pe, np.asarray(halo_row))
        if out is None:
            return rows
        out.copy_(rows)
        return out

    def gather(self, pe: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Row rows[i] of PE pe[i]'s slice for every i, in that order (this PE's rows too): int32
        [k] tensors on this GPU, trusted to be in range -> [k, dim] (one kernel launch, no host
        round trip; the store's `gather_rows`)."""
        if self.store.gather_rows is None:
            raise RuntimeError("NvshmemStore has no row-gather kernel: build it with "
                               "mgg.runtime.make_store(comm, 'gpu') or pass gather_rows=")
        return self.store.gather_rows(self, pe, rows)

    def get_rows(self, pe: int, rows: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows_per_pe):
            raise IndexError(f"get_rows: row ids out of [0, {self.rows_per_pe}) for PE {pe}")
        return self.get_halo(np.r_[np.zeros(pe + 1, np.int64), len(rows)], rows, out)

    def free(self) -> None:
        import nvshmem.core as nvshmem

        if self.padded is None:
            return
        self.store.quiesce()
        nvshmem.free_tensor(self.padded)
        self.padded = None
        self.store._live -= 1


class NvshmemStore(SymmetricStore):
    """Symmetric memory in NVSHMEM, one PE per MPI rank and GPU.

    NVSHMEM is initialised once per process: `NvshmemStore(comm)` returns the process's store
    (it is the store context of the brief), and finalises it at exit, after every array was freed.
    `gather_rows` (a `RowGather`) reads other PEs' rows; the first store given one keeps it.
    """

    name = "nvshmem"
    _instance: "NvshmemStore | None" = None
    _guard = threading.Lock()

    def __new__(cls, comm: Communicator, gather_rows: RowGather | None = None):
        with cls._guard:
            if cls._instance is None:
                inst = super().__new__(cls)
                inst._init(comm)
                cls._instance = inst
                atexit.register(inst.finalize)
            elif cls._instance.comm.size != comm.size:
                raise RuntimeError("NvshmemStore: NVSHMEM is already initialised over another communicator")
            if cls._instance.gather_rows is None:
                cls._instance.gather_rows = gather_rows
            return cls._instance

    def __init__(self, comm: Communicator, gather_rows: RowGather | None = None):
        pass

    def _init(self, comm: Communicator) -> None:
        import nvshmem.core as nvshmem
        from mpi4py import MPI

        try:
            from cuda.core import Device
        except ImportError:  # older cuda.core
            from cuda.core.experimental import Device

        self.comm = comm
        ngpu = torch.cuda.device_count()
        if ngpu == 0:
            raise RuntimeError("NvshmemStore: no CUDA device visible")
        self.device_index = device_index(comm.local_rank, ngpu)
        torch.cuda.set_device(self.device_index)
        dev = Device(self.device_index)
        dev.set_current()
        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "8G")
        mpi_comm = comm.comm if comm.comm is not None else MPI.COMM_SELF
        # nvshmem4py prints its MPI detection ("Importing MPI", "MPI4Py enabled: True") on every
        # rank: kept out of the user's log unless the initialisation fails
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                nvshmem.init(device=dev, mpi_comm=mpi_comm, initializer_method="mpi")
        except BaseException:
            sys.stderr.write(said.getvalue())
            raise
        self._live = 0
        self._closed = False
        self._reduce_bufs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.gather_rows: RowGather | None = None

    def quiesce(self) -> None:
        """Wait until no PE has NVSHMEM work in flight: every stream of this GPU drained, then an
        MPI barrier. Call it before a host-side NVSHMEM collective (malloc, free, finalize): their
        internal barrier must not run while an on-stream barrier or reduction is still queued on
        some PE, or the two interleave and a PE waits for ever (seen at P = 4: an allocation during
        the first evaluation, after a training step's on-stream gradient reduction)."""
        torch.cuda.synchronize()
        self.comm.barrier()

    def allocate(self, rows_per_pe: int, dim: int, dtype: torch.dtype = torch.float32) -> SymmetricArray:
        arr = _NvshmemArray(self, rows_per_pe, dim, dtype)
        self._live += 1
        return arr

    def allreduce_sum_(self, flat: torch.Tensor) -> bool:
        """Sum the 1-D float32 CUDA tensor `flat` over every PE, in place, on the current stream:
        NVSHMEM's on-stream sum reduction (nvshmemx_float_sum_reduce_on_stream) over two symmetric
        scratch vectors of exactly its length, allocated once per length (collective: every PE
        calls it with the same length). No host synchronisation. False for other tensors."""
        import nvshmem.core as nvshmem

        if flat.dtype != torch.float32 or not flat.is_cuda or flat.dim() != 1:
            return False
        n = int(flat.numel())
        if n == 0:
            return True
        if n not in self._reduce_bufs:  # the reduction covers the whole allocation: exact size
            self.quiesce()  # once per length, in the first step (never inside a CUDA graph capture)
            self._reduce_bufs[n] = (nvshmem.tensor((n,), dtype=torch.float32),
                                    nvshmem.tensor((n,), dtype=torch.float32))
        src, dst = self._reduce_bufs[n]
        src.copy_(flat)
        nvshmem.reduce(nvshmem.Teams.TEAM_WORLD, dst, src, "sum",
                       stream=StreamRef(torch.cuda.current_stream().cuda_stream))
        flat.copy_(dst)
        return True

    def close(self) -> None:
        """Arrays are freed by their owners; NVSHMEM itself stays up until `finalize` (at exit)."""

    def finalize(self) -> None:
        import nvshmem.core as nvshmem

        if self._closed:
            return
        self._closed = True
        if self._live:  # leaked arrays: NVSHMEM frees them in finalize
            import sys

            sys.stderr.write(f"mgg: {self._live} NVSHMEM arrays were not freed before exit\n")
        # Collective: a rank that cannot finish it (a peer gone, or work NVSHMEM still waits on)
        # aborts the job with a message after FINALIZE_TIMEOUT_S instead of hanging at exit.
        from .watchdog import Watchdog

        dog = Watchdog(FINALIZE_TIMEOUT_S, rank=self.comm.rank)
        try:
            with dog.phase("NVSHMEM finalize at exit"):
                self.quiesce()
                for pair in self._reduce_bufs.values():
                    for t in pair:
                        nvshmem.free_tensor(t)
                self._reduce_bufs.clear()
                nvshmem.finalize()
        finally:
            dog.close()
