"""Data-parallel helpers: weights are replicated on every rank, gradients are summed.

Full-graph training: each rank computes the gradient of its share of the loss (normalised by
the *global* number of training nodes), so the summed gradient equals the gradient of a 1-rank
run (`allreduce_gradients`). Mini-batch training: each rank computes the gradient of its
*summed* loss and its number of terms; `allreduce_mean_gradients` sums both and divides, which
gives the gradient of the mean over the step's global batch whatever each rank's share of it
(a rank with no terms contributes zeros). Buffers are flattened into one float64 host array and
reduced with a single all-reduce, or, on GPUs with the NVSHMEM store, into one float32 device
vector reduced on the stream (no host round trip).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["broadcast_parameters", "allreduce_gradients", "allreduce_mean_gradients", "flatten", "unflatten_into"]


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


def allreduce_gradients(model: nn.Module, comm, store=None,
                        extra: float | torch.Tensor | None = None) -> float | torch.Tensor | None:
    """Sum `.grad` of every parameter over all ranks (collective; missing grads count as 0), and
    with them the scalar `extra` when given (a float, or a 0-dim float32 tensor on the GPU).

    With a `store` that reduces on the device (the NVSHMEM store: `SymmetricStore.allreduce_sum_`)
    and float32 gradients on one GPU, the gradients are summed there, on the current stream,
    in one flat vector: no host synchronisation. Otherwise they go through one float64 host
    all-reduce (MPI). Returns the summed `extra` (as given at P = 1; a 0-dim device tensor when the
    store reduced it), or None without one."""
    if comm.size == 1:
        return extra
    return _allreduce(_grads_of(model), comm, store, extra)


def allreduce_mean_gradients(model: nn.Module, comm, count: int | torch.Tensor, store=None) -> float | torch.Tensor:
    """Turn every rank's gradient of a *summed* loss of `count` terms into the gradient of the
    mean over all ranks' terms: grad = (sum_r grad_r) / (sum_r count_r), in place. Collective
    (one all-reduce, the count travels with the gradients); missing grads count as 0, and a step
    where every rank has 0 terms leaves zero gradients.

    Args:
        count: this rank's number of loss terms (>= 0), e.g. its seeds in the step: an int, or a
            0-dim float32 tensor on the gradients' GPU (a step replayed from a CUDA graph counts
            on the device; reduced on the device where the store can, else read on the host).
        store: as in `allreduce_gradients` (on-device reduction where it applies).
    Returns:
        sum_r count_r: a float, or a 0-dim float32 tensor on the gradients' GPU when the count
        was one at P = 1 or the store reduced it there (no host synchronisation).
    """
    grads = _grads_of(model)
    if comm.size == 1:
        total: float | torch.Tensor = count if isinstance(count, torch.Tensor) else float(count)
    else:
        total = _allreduce(grads, comm, store, count if isinstance(count, torch.Tensor) else float(count))
    scale = 1.0 / max(total, 1.0) if isinstance(total, float) else 1.0 / total.clamp(min=1.0)
    if grads:
        with torch.no_grad():
            torch._foreach_mul_(grads, scale)  # a float or a 0-dim tensor: one launch for all
    return total


def _grads_of(model: nn.Module) -> list[torch.Tensor]:
    """`.grad` of every trainable parameter (zeros where a parameter has none)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]


def _allreduce(grads: list[torch.Tensor], comm, store, extra: float | torch.Tensor | None) -> float | torch.Tensor | None:
    """Sum `grads` (in place) and, when given, the scalar `extra` (a float or a 0-dim tensor) over
    the ranks in one all-reduce; returns the summed `extra` (a 0-dim device tensor when the store
    reduced on the GPU)."""
    if store is not None and grads and len({g.device for g in grads}) == 1 and grads[0].is_cuda \
            and all(g.dtype == torch.float32 for g in grads):
        parts = [g.reshape(-1) for g in grads]
        if isinstance(extra, torch.Tensor):
            parts.append(extra.detach().reshape(1).to(device=grads[0].device, dtype=torch.float32))
        elif extra is not None:
            parts.append(torch.full((1,), extra, dtype=torch.float32, device=grads[0].device))
        flat = torch.cat(parts)
        if store.allreduce_sum_(flat):
            with torch.no_grad():
                unflatten_into(flat, grads)
            return None if extra is None else flat[-1]
    buf = flatten(grads)
    if extra is not None:
        buf = np.append(buf, float(extra))
    comm.allreduce_(buf)
    with torch.no_grad():
        unflatten_into(buf, grads)
    return None if extra is None else float(buf[-1])
