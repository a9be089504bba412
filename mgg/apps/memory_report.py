"""Per-rank peak memory for the metrics JSON (`memory`): host RSS, GPU allocations, symmetric heap.

    {"ranks": [{"rank", "host_peak_mb", "gpu_peak_mb", "sym_heap_mb"}, ...],   # rank order
     "host_peak_mb_max", "gpu_peak_mb_max", "sym_heap_mb_max"}

host_peak_mb: the process's peak resident set (``resource.getrusage(RUSAGE_SELF).ru_maxrss``;
pages of memory-mapped files that were read count too). gpu_peak_mb:
``torch.cuda.max_memory_allocated`` of the rank's device (0 on the CPU backend; NVSHMEM's heap is
not a torch allocation). sym_heap_mb: bytes of the symmetric arrays the DistGraph allocated on
each PE (``rows_per_pe * dim * itemsize`` each; MPI windows on the CPU, NVSHMEM on the GPU).
"""
from __future__ import annotations

import resource
import sys
from typing import Any

__all__ = ["rank_memory", "memory_summary"]

_MB = float(1 << 20)


def _host_peak_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # Linux: KiB


def _sym_heap_bytes(dg: Any) -> int:
    total = 0
    for arr in getattr(dg, "_arrays", {}).values():
        itemsize = arr.dtype.itemsize if hasattr(arr.dtype, "itemsize") else 4
        total += int(arr.rows_per_pe) * int(arr.dim) * int(itemsize)
    return total


def rank_memory(rank: int, dg: Any) -> dict:
    """This rank's entry: {"rank", "host_peak_mb", "gpu_peak_mb", "sym_heap_mb"} (MiB, 2 decimals)."""
    gpu = 0
    device = getattr(dg, "device", None)
    if device is not None and getattr(device, "type", "") == "cuda":
        import torch

        gpu = torch.cuda.max_memory_allocated(device)
    return {"rank": int(rank), "host_peak_mb": round(_host_peak_bytes() / _MB, 2),
            "gpu_peak_mb": round(gpu / _MB, 2), "sym_heap_mb": round(_sym_heap_bytes(dg) / _MB, 2)}


def memory_summary(comm: Any, dg: Any) -> dict:
    """Every rank's `rank_memory`, gathered (allgather: collective, the same dict on all ranks)."""
    ranks = sorted(comm.allgather(rank_memory(comm.rank, dg)), key=lambda r: r["rank"])
    out: dict = {"ranks": ranks}
    for k in ("host_peak_mb", "gpu_peak_mb", "sym_heap_mb"):
        out[f"{k}_max"] = max(r[k] for r in ranks)
    return out
