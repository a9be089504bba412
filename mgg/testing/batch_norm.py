"""What the DistBatchNorm tests share: the graph a DistBatchNorm reads (communicator, store, row
bounds) without building a DistGraph, and float64 sums over ranks on the host."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

__all__ = ["norm_graph", "host_sum"]


def norm_graph(comm, store, bounds) -> SimpleNamespace:
    """The attributes of a DistGraph that DistBatchNorm uses: comm, store, bounds (int64 [P+1]:
    rank r holds rows [bounds[r], bounds[r+1])), rank and world_size."""
    return SimpleNamespace(comm=comm, store=store, bounds=np.asarray(bounds), rank=comm.rank,
                           world_size=comm.size)


def host_sum(comm, a) -> np.ndarray:
    """float64 copy of `a` summed over every rank of `comm` (allreduce; one rank: the copy)."""
    a = np.ascontiguousarray(a, dtype=np.float64).copy()
    if comm.size > 1:
        comm.allreduce_(a)
    return a
