"""This rank's rows of a global CSR as tensors on the plan device, and how DistGraph's "auto"
builds the transposed ones (a scan of the global CSR, or an exchange of each rank's edges)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ..runtime.gpu_assignment import device_index

__all__ = ["RankRows", "host_tensor", "auto_transpose", "SCAN_GPU_FRACTION", "SCAN_MAX_BYTES"]


@dataclass
class RankRows:
    """This rank's rows of a global CSR (forward: targets in range; transposed: sources in range),
    as tensors on the plan device; row k is global node lo + k."""

    indptr: torch.Tensor   # int64 [n + 1]
    indices: torch.Tensor  # int64 [E_r] global ids of the other endpoint
    lo: int = 0

    @property
    def row_ids(self) -> torch.Tensor:
        """int64 [E_r] global id of the row node of each entry."""
        counts = self.indptr[1:] - self.indptr[:-1]
        return self.lo + torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device),
                                                 counts, output_size=self.indices.numel())


def host_tensor(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with `a` (read-only arrays, e.g. memory maps, too: only read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array"
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


#: the largest global CSR (int64 indices + indptr) that "auto" scans on each rank's GPU: a fraction
#: of the GPU's memory, at most SCAN_MAX_BYTES (larger graphs use the exchange)
SCAN_GPU_FRACTION = 0.125
SCAN_MAX_BYTES = 8 << 30


def auto_transpose(indptr: np.ndarray, indices: np.ndarray, world_size: int, backend: str,
                   local_rank: int = 0) -> str:
    """How DistGraph's "auto" builds the transposed rows. "scan" (every rank reads the global
    CSR) unless `indices` is a memory map at P > 1 and the scan would not run on a GPU with room
    for the whole CSR: then "exchange" (each rank reads its own rows; one all-to-all on the host).
    On the GPU the scan is a radix sort of every edge, far cheaper than the host exchange: the
    exchange took 2.2-3.4 s of the CLI's partition phase for reddit-like at P = 2 and 4 on 4x H200
    against 0.3 s for the scan at P = 1 (bench/results/2026-11-26-h200x4-f14d292/c4)."""
    if not isinstance(indices, np.memmap) or world_size <= 1:
        return "scan"
    if backend != "gpu" or not torch.cuda.is_available():
        return "exchange"
    csr_bytes = 8 * (int(indices.shape[0]) + int(indptr.shape[0]))
    dev = device_index(local_rank, torch.cuda.device_count())
    room = min(SCAN_MAX_BYTES, SCAN_GPU_FRACTION * torch.cuda.get_device_properties(dev).total_memory)
    return "scan" if csr_bytes <= room else "exchange"
