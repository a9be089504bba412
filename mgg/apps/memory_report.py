"""Per-rank memory of a training run for the metrics JSON: host peak RSS, GPU peak allocation and
the symmetric-store buffers, gathered on every rank with one all-reduce."""
from __future__ import annotations

import resource
import sys

import numpy as np

__all__ = ["memory_report", "host_peak_mb", "gpu_peak_mb"]


def host_peak_mb() -> float:
    """This process's peak resident set so far (MiB): ru_maxrss is KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def gpu_peak_mb() -> float:
    """torch's peak allocation so far on the current GPU (MiB); 0 where CUDA was never initialised."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0.0
    return torch.cuda.max_memory_allocated() / 2**20


def memory_report(comm, dg) -> dict:
    """{"ranks": [{rank, host_peak_mb, gpu_peak_mb, sym_mb}], "max_host_peak_mb", "max_gpu_peak_mb"}.

    gpu_peak_mb is torch's peak allocation on this rank's GPU (0 on the CPU path); sym_mb the
    symmetric buffers this DistGraph allocated (NVSHMEM heap or MPI window), rows_per_pe x width.
    Collective."""
    import torch

    gpu = 0.0
    if dg.device.type == "cuda":
        gpu = torch.cuda.max_memory_allocated(dg.device) / 2**20
    sym = sum(a.rows_per_pe * a.dim * torch.empty((), dtype=a.dtype).element_size()
              for a in dg._arrays.values()) / 2**20
    table = np.zeros((comm.size, 3), dtype=np.float64)
    table[comm.rank] = (host_peak_mb(), gpu, sym)
    comm.allreduce_(table.reshape(-1))
    ranks = [{"rank": r, "host_peak_mb": round(float(h), 1), "gpu_peak_mb": round(float(g), 1),
              "sym_mb": round(float(s), 1)} for r, (h, g, s) in enumerate(table)]
    return {"ranks": ranks, "max_host_peak_mb": round(float(table[:, 0].max()), 1),
            "max_gpu_peak_mb": round(float(table[:, 1].max()), 1)}
