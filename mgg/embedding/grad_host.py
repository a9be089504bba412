"""Row gradients to their owners through MPI: the CPU store's `reduce_gradients` exchange.

Every rank sends its coalesced (local row, gradient) pairs, grouped by owner, with one
`Alltoall` of the counts and two `Alltoallv`s (rows, then values); each owner sums what it
received by row. Collective; the GPU store's exchange is mgg.embedding.grad_exchange.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["exchange_on_host"]


def exchange_on_host(comm, owner: np.ndarray, local: np.ndarray, g: torch.Tensor, world: int
                     ) -> tuple[np.ndarray, torch.Tensor]:
    """Collective: this rank's gradient rows to their owners.

    owner, local: int64 [k] the owner rank and local row of each of this rank's rows (unique);
    g: float [k, D] their gradients (CPU). Returns (my rows int64 [r], ascending and unique;
    their summed gradients [r, D] in g's dtype)."""
    from mpi4py import MPI

    dim, dtype = int(g.shape[1]), g.dtype
    order = np.argsort(owner, kind="stable")
    send_rows = np.ascontiguousarray(local[order])
    send_g = np.ascontiguousarray(g.numpy()[order])
    scount = np.bincount(owner, minlength=world).astype(np.int64)
    rcount = np.empty(world, dtype=np.int64)
    mpi = comm.comm
    with comm.guard("embedding gradient alltoall"):
        mpi.Alltoall(scount, rcount)
        sdisp = np.concatenate([[0], np.cumsum(scount)[:-1]])
        rdisp = np.concatenate([[0], np.cumsum(rcount)[:-1]])
        recv_rows = np.empty(int(rcount.sum()), dtype=np.int64)
        mpi.Alltoallv([send_rows, scount, sdisp, MPI.INT64_T], [recv_rows, rcount, rdisp, MPI.INT64_T])
        recv_g = np.empty((int(rcount.sum()), dim), dtype=send_g.dtype)
        mt = MPI.DOUBLE if send_g.dtype == np.float64 else MPI.FLOAT
        mpi.Alltoallv([send_g, scount * dim, sdisp * dim, mt], [recv_g, rcount * dim, rdisp * dim, mt])
    rows, rinv = np.unique(recv_rows, return_inverse=True)
    vals = torch.zeros((len(rows), dim), dtype=dtype).index_add_(0, torch.from_numpy(rinv.reshape(-1)),
                                                                 torch.from_numpy(recv_g))
    return rows, vals
