"""Data-parallel helpers: weights are replicated on every rank, gradients are summed.

Each rank computes the gradient of its share of the loss (normalised by the *global* number of
training nodes), so the summed gradient equals the gradient of a 1-rank run. Buffers are
flattened into one float64 host array and reduced with a single all-reduce, or, on GPUs with
the NVSHMEM store, into one float32 device vector reduced on the stream (no host round trip).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["broadcast_parameters", "allreduce_gradients", "flatten", "unflatten_into"]


def flatten(tensors: list[torch.Tensor]) -> np.ndarray:
    """Concatenate tensors into one contiguous float64 numpy array (host copy). Tensors on one
    GPU are concatenated there first, so the host receives one copy (one synchronisation), not
    one per tensor."""
    if not tensors:
        return np.zeros(0, dtype=np.float64)
    devices = {t.device for t in tensors}
    if len(devices) == 1:
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
        return flat.to("cpu").numpy().copy() if flat.device.type != "cpu" else flat.numpy()
    return torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors]).numpy().copy()


def unflatten_into(buf: np.ndarray | torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of `buf` (a host array, or a 1-D tensor) back into `tensors` (in
    place, keeping dtype/device); to a GPU the buffer goes in one copy, then it is sliced there."""
    src = torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf
    devices = {t.device for t in tensors}
    if len(devices) == 1 and next(iter(devices)).type != "cpu":
        src = src.to(next(iter(devices)))
    off = 0
    for t in tensors:
        n = t.numel()
        t.copy_(src[off: off + n].view_as(t))
        off += n


def broadcast_parameters(model: nn.Module, comm, root: int = 0) -> None:
    """Overwrite every parameter and buffer with `root`'s values (collective)."""
    if comm.comm is None or comm.size == 1:
        return
    tensors = [p.data for p in model.parameters()] + [b for b in model.buffers()]
    buf = flatten(tensors)
    comm.comm.Bcast(buf, root=root)
    with torch.no_grad():
        unflatten_into(buf, tensors)


def allreduce_gradients(model: nn.Module, comm, store=None) -> None:
    """Sum `.grad` of every parameter over all ranks (collective; missing grads count as 0).

    With a `store` that reduces on the device (the NVSHMEM store: `SymmetricStore.allreduce_sum_`)
    and float32 gradients on one GPU, the gradients are summed there, on the current stream,
    in one flat vector: no host synchronisation. Otherwise they go through one float64 host
    all-reduce (MPI)."""
    if comm.size == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    if store is not None and grads and len({g.device for g in grads}) == 1 and grads[0].is_cuda \
            and all(g.dtype == torch.float32 for g in grads):
        flat = torch.cat([g.reshape(-1) for g in grads])
        if store.allreduce_sum_(flat):
            with torch.no_grad():
                unflatten_into(flat, grads)
            return
    buf = flatten(grads)
    comm.allreduce_(buf)
    with torch.no_grad():
        unflatten_into(buf, grads)
