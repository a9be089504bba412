"""Halo exchange primitives: fetch the unique remote rows a rank reads, and send gradients back.

A plan's halo (`AggregationPlan.halo_ptr` / `halo_row`, see mgg.runtime.plan) lists every remote
(PE, row) pair that this rank's targets read, each once, sorted by PE. The structure of a plan
does not depend on the aggregation kind (only the edge weights do), so both primitives use
`dg.plan("sum", transposed)` for it.

* `gather_halo(dg, x)` -> halo [H, D]: halo[h] = x_{owner(h)}[row(h)]. One symmetric-store
  exchange: write x into `dg.symmetric(D)`, publish, one-sided get of every halo row, release.
* `scatter_halo_add(dg, g)` -> [n_local, D]: the adjoint. Every halo row's value g[h] is sent to
  its owner and summed there into row(h). Implemented as a two-sided MPI `Alltoallv` over
  `comm.comm` of (row ids, values): the send buffer is already grouped by destination PE (halo
  order), so no packing is needed, and the sum at the owner is a local `index_add_`; an RMA
  `Accumulate` would need an extra [rows_per_pe, D] window and serialises on element-wise atomics.
  CUDA tensors are staged through host memory (the GPU path of this primitive is GPU-untested).

Both are collective (every rank calls them, in the same order), and adjoint:
    <scatter_halo_add(dg, g), x> == <g, gather_halo(dg, x)>   for all x [n_local, D], g [H, D].
With one rank, or a rank that reads nothing remote, the halo is empty (H = 0).
"""
from __future__ import annotations

import numpy as np
import torch

from .plan import AggregationPlan

__all__ = ["halo_plan", "gather_halo", "scatter_halo_add"]

_TORCH_TO_NP = {torch.float32: np.float32, torch.float64: np.float64}


def halo_plan(dg, transposed: bool = False) -> AggregationPlan:
    """The plan whose structure (local/remote CSR, halo) every fused executor uses."""
    return dg.plan("sum", transposed)


def gather_halo(dg, x: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """Rows of other ranks that this rank's targets read, each unique row once. Collective.

    Args:
        dg: the DistGraph.
        x: float [n_local, D], this rank's rows (any device the store serves).
        transposed: use the halo of the transposed plan (sources of the reverse graph).
    Returns:
        float [H, D] in halo order (H = plan.halo_size), same dtype/device as x.
    """
    plan = halo_plan(dg, transposed)
    if x.dim() != 2 or x.shape[0] != dg.n_local:
        raise ValueError(f"gather_halo: expected x of shape [{dg.n_local}, D] on rank {dg.rank}, "
                         f"got {tuple(x.shape)}")
    dim = int(x.shape[1])
    if dg.world_size == 1:
        return x.new_zeros((0, dim))
    sym = dg.symmetric(dim, x.dtype)
    with dg.comm.guard("gather_halo"):
        sym.write(x.detach().contiguous())
        sym.publish()
        halo = sym.get_halo(plan.halo_ptr, plan.halo_row)
        sym.release()
    return halo.to(x.device)


def scatter_halo_add(dg, halo_grad: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """Adjoint of `gather_halo`: out[row] += halo_grad[h] at the owner of every halo row h. Collective.

    Args:
        dg: the DistGraph.
        halo_grad: float [H, D], one row per halo entry of this rank's plan.
        transposed: the halo of the transposed plan (as in `gather_halo`).
    Returns:
        float [n_local, D]: the sum of every rank's halo rows owned here (zeros where none).
    """
    plan = halo_plan(dg, transposed)
    if halo_grad.dim() != 2 or halo_grad.shape[0] != plan.halo_size:
        raise ValueError(f"scatter_halo_add: expected [{plan.halo_size}, D] on rank {dg.rank}, "
                         f"got {tuple(halo_grad.shape)}")
    dim = int(halo_grad.shape[1])
    out = halo_grad.new_zeros((dg.n_local, dim))
    comm = dg.comm
    if dg.world_size == 1 or comm.comm is None:
        return out  # one rank: the halo is empty
    if halo_grad.dtype not in _TORCH_TO_NP:
        raise TypeError(f"scatter_halo_add: unsupported dtype {halo_grad.dtype}")
    from mpi4py import MPI

    P = dg.world_size
    send_counts = np.diff(plan.halo_ptr).astype(np.int64)
    recv_counts = np.zeros(P, dtype=np.int64)
    vals = np.ascontiguousarray(halo_grad.detach().to("cpu").numpy())
    rows = np.ascontiguousarray(plan.halo_row, dtype=np.int64)
    with comm.guard("scatter_halo_add"):
        comm.comm.Alltoall(send_counts, recv_counts)
        n_recv = int(recv_counts.sum())
        sdis = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(np.int64)
        rdis = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(np.int64)
        r_rows = np.empty(n_recv, dtype=np.int64)
        r_vals = np.empty((n_recv, dim), dtype=vals.dtype)
        comm.comm.Alltoallv([rows, (send_counts, sdis), MPI.INT64_T],
                            [r_rows, (recv_counts, rdis), MPI.INT64_T])
        if dim > 0:
            # one datatype per row keeps counts in rows (well inside int32 for any real halo)
            elem = MPI._typedict[vals.dtype.char]
            rtype = elem.Create_contiguous(dim).Commit()
            try:
                comm.comm.Alltoallv([vals, (send_counts, sdis), rtype],
                                    [r_vals, (recv_counts, rdis), rtype])
            finally:
                rtype.Free()
    if n_recv and dim:
        if r_rows.min() < 0 or r_rows.max() >= dg.n_local:
            raise IndexError(f"scatter_halo_add: rank {dg.rank} received rows outside [0, {dg.n_local})")
        out.index_add_(0, torch.from_numpy(r_rows).to(out.device),
                       torch.from_numpy(r_vals).to(out.device, out.dtype))
    return out
