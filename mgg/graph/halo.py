"""Halo exchange primitives: fetch the unique remote rows a rank reads, and send gradients back.

A plan's halo (`AggregationPlan.halo_ptr` / `halo_row`, see mgg.runtime.plan) lists every remote
(PE, row) pair that this rank's targets read, each once, sorted by PE. The structure of a plan
does not depend on the aggregation kind (only the edge weights do), so both primitives use
`dg.plan("sum", transposed)` for it.

* `gather_halo(dg, x)` -> halo [H, D]: halo[h] = x_{owner(h)}[row(h)]. One symmetric-store
  exchange: write x into `dg.symmetric(D)`, publish, one-sided get of every halo row, release.
* `scatter_halo_add(dg, g)` -> [n_local, D]: the adjoint. Every halo row's value g[h] is summed
  at its owner into row(h). Also one symmetric-store exchange: readers publish their halo
  gradients, owners get the rows that are theirs (an export plan exchanged once with MPI) and
  `index_add_` them -- device-resident on the GPU (NVSHMEM gets), MPI RMA on CPU.

Both are collective (every rank calls them, in the same order), and adjoint:
    <scatter_halo_add(dg, g), x> == <g, gather_halo(dg, x)>   for all x [n_local, D], g [H, D].
With one rank, or a rank that reads nothing remote, the halo is empty (H = 0).
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.plan import AggregationPlan

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


class _ExportPlan:
    """Who reads which of my rows: the adjoint of a plan's halo, built once per (dg, direction).

    `ptr` int64 [P+1] and `pos` int64 [X]: for reader PE p, pos[ptr[p]:ptr[p+1]] are positions
    in p's halo whose owner is this rank; `rows` int64 [X] are the matching local rows here.
    `max_halo` is the largest halo over the ranks (the symmetric buffer's row count).
    """

    def __init__(self, dg, transposed: bool):
        from mpi4py import MPI

        plan = halo_plan(dg, transposed)
        comm, P = dg.comm.comm, dg.world_size
        send_counts = np.diff(plan.halo_ptr).astype(np.int64)
        recv_counts = np.zeros(P, dtype=np.int64)
        comm.Alltoall(send_counts, recv_counts)
        starts = np.ascontiguousarray(plan.halo_ptr[:-1], dtype=np.int64)
        peer_starts = np.zeros(P, dtype=np.int64)
        comm.Alltoall(starts, peer_starts)   # where my rows begin in each reader's halo
        sdis = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(np.int64)
        rdis = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(np.int64)
        rows = np.empty(int(recv_counts.sum()), dtype=np.int64)
        comm.Alltoallv([np.ascontiguousarray(plan.halo_row, dtype=np.int64), (send_counts, sdis), MPI.INT64_T],
                       [rows, (recv_counts, rdis), MPI.INT64_T])
        if rows.size and (rows.min() < 0 or rows.max() >= dg.n_local):
            raise IndexError(f"scatter_halo_add: rank {dg.rank} is asked for rows outside [0, {dg.n_local})")
        self.ptr = np.concatenate([[0], np.cumsum(recv_counts)]).astype(np.int64)
        self.pos = np.concatenate([peer_starts[p] + np.arange(recv_counts[p], dtype=np.int64) for p in range(P)])
        self.rows = rows
        self.max_halo = int(dg.comm.allreduce_scalar(float(plan.halo_size), "max"))
        self._rows_t: dict = {}

    def rows_on(self, device: torch.device) -> torch.Tensor:
        if device not in self._rows_t:
            self._rows_t[device] = torch.from_numpy(self.rows).to(device)
        return self._rows_t[device]


def _export_plan(dg, transposed: bool) -> _ExportPlan:
    cache = dg.__dict__.setdefault("_halo_export", {})
    if transposed not in cache:
        cache[transposed] = _ExportPlan(dg, transposed)
    return cache[transposed]


def _halo_buffer(dg, rows: int, dim: int, dtype: torch.dtype):
    """A symmetric [rows, dim] buffer for halo gradients, allocated once per (rows, dim, dtype)."""
    key = ("halo", rows, dim, dtype)  # kept with dg's other symmetric arrays: freed by dg.close()
    if key not in dg._arrays:
        dg._arrays[key] = dg.store.allocate(rows, dim, dtype)
    return dg._arrays[key]


def scatter_halo_add(dg, halo_grad: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """Adjoint of `gather_halo`: out[row] += halo_grad[h] at the owner of every halo row h. Collective.

    Through the symmetric store, like the gather: every rank writes its halo rows into a
    symmetric [max_halo, D] buffer and publishes it; each owner *gets* the rows readers hold for
    it (one-sided: NVSHMEM on the GPU, MPI RMA on CPU), sums them into its rows with `index_add_`,
    and releases. Which positions of which reader's halo belong to this rank (the export plan) is
    exchanged once per DistGraph and direction with MPI `Alltoallv`.

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
    if dg.world_size == 1 or dg.comm.comm is None:
        return out  # one rank: the halo is empty
    if halo_grad.dtype not in _TORCH_TO_NP:
        raise TypeError(f"scatter_halo_add: unsupported dtype {halo_grad.dtype}")
    with dg.comm.guard("scatter_halo_add"):
        ex = _export_plan(dg, transposed)
        if ex.max_halo == 0 or dim == 0:
            return out
        buf = _halo_buffer(dg, ex.max_halo, dim, halo_grad.dtype)
        if plan.halo_size:
            buf.write(halo_grad.detach().contiguous())  # rows past H are never read
        buf.publish()
        got = buf.get_halo(ex.ptr, ex.pos) if len(ex.rows) else None
        buf.release()
    if got is not None:
        got = got.to(out.device, out.dtype)
        out.index_add_(0, ex.rows_on(out.device), got)
    return out
