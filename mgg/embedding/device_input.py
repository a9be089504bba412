"""One table's bag input for the GPU lookup, checked without reading its values.

`check_bag_input` (mgg.embedding.validate) reads the ids and offsets to check them, which on a GPU
is a host synchronisation. The GPU lookup instead checks here only what the host knows without
looking (dtypes, ranks, shapes, the pooling mode against per-sample weights, empty offsets) and
hands the tensors as they are to the lookup kernel, which checks every id and offset on the GPU
and records what was wrong (mgg.kernels.embedding_gpu status records). The caller reads that
record once per call (checks "sync") or when it asks (checks "deferred") and then raises the
same errors `check_bag_input` raises.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .validate import MODES, as_tensor, offsets_tensor, weights_tensor

__all__ = ["CHECKS", "DeviceBags", "device_bag_input"]

#: when the GPU lookup raises for bad ids or offsets: "sync" reads the kernel's status record at
#: the end of every call (one small device-to-host copy and one synchronisation) and raises before
#: the result is returned; "deferred" never synchronises (the call can be captured in a CUDA
#: graph), bags with a bad id come out NaN, and `raise_input_errors()` raises what was recorded.
CHECKS = ("sync", "deferred")

_ID_DTYPES = (torch.int32, torch.int64)


@dataclass
class DeviceBags:
    """One table's bags on its GPU, as the lookup kernel reads them.

    Attributes:
        ids: int32 or int64 [n], contiguous.
        offsets: int32 or int64 [R], contiguous; None for bags of `bag_size` ids (2-D input).
        num_bags: B: R, or R - 1 with include_last_offset, or rows of the 2-D input.
        bag_size: ids a bag without offsets (0 with offsets).
        per_sample_weights: float32 [n], contiguous, or None.
        copies: host-to-device copies made (ids, offsets or weights given on the host).
        conversions: device-side dtype / layout conversions made (one kernel launch each).
        source: the caller's (indices, offsets, per_sample_weights), for the exact error message.
    """

    ids: torch.Tensor
    offsets: torch.Tensor | None
    num_bags: int
    bag_size: int
    per_sample_weights: torch.Tensor | None
    copies: int
    conversions: int
    source: tuple


class _Mover:
    """Moves tensors to the GPU in the dtypes the kernel reads, counting what that costs."""

    def __init__(self, device: torch.device):
        self.device, self.copies, self.conversions = device, 0, 0

    def __call__(self, t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
        if t.device != self.device:
            t = t.to(self.device, non_blocking=True)
            self.copies += 1
        if t.dtype not in dtypes:
            t = t.to(dtypes[-1])
            self.conversions += 1
        if not t.is_contiguous():
            t = t.contiguous()
            self.conversions += 1
        return t


def device_bag_input(indices, offsets, per_sample_weights, *, mode: str, include_last_offset: bool,
                     device: torch.device, what: str = "EmbeddingBag") -> DeviceBags:
    """Check what can be checked without reading values and place the tensors on `device`.

    The same input forms as `check_bag_input`: 1-D indices with offsets [B] (or [B + 1] with
    include_last_offset), or 2-D indices [B, L] without offsets; per_sample_weights only with
    mode "sum", the shape of indices."""
    if mode not in MODES:
        raise ValueError(f"{what}: mode must be one of {MODES}, got {mode!r}")
    source = (indices, offsets, per_sample_weights)
    idx = as_tensor(indices, f"{what}: indices")
    if idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():
        raise TypeError(f"{what}: indices must be an integer tensor, got {idx.dtype}")
    move = _Mover(device)
    psw = None
    if per_sample_weights is not None:
        psw = weights_tensor(per_sample_weights, mode, what)
    if offsets is None:
        if idx.dim() != 2:
            raise ValueError(f"{what}: without offsets, indices must be 2-D [bags, bag_size]; got {idx.dim()}-D")
        b, l = idx.shape
        if psw is not None and tuple(psw.shape) != (b, l):
            raise ValueError(f"{what}: per_sample_weights must have the shape of indices {(b, l)}, got {tuple(psw.shape)}")
        ids = move(idx.reshape(-1), _ID_DTYPES)
        psw = None if psw is None else move(psw.reshape(-1), (torch.float32,))
        return DeviceBags(ids, None, int(b), int(l), psw, move.copies, move.conversions, source)
    off = offsets_tensor(offsets, idx, what)
    n, R = int(idx.numel()), int(off.numel())
    if include_last_offset and R == 0:
        raise ValueError(f"{what}: include_last_offset=True needs at least one offset")
    if R == 0 and not include_last_offset and n:
        raise ValueError(f"{what}: offsets is empty (0 bags) but indices has {n} entries; "
                         f"every index must belong to a bag (offsets [0] makes one bag)")
    if psw is not None and (psw.dim() != 1 or psw.numel() != n):
        raise ValueError(f"{what}: per_sample_weights must be 1-D with len(indices)={n} entries, got shape {tuple(psw.shape)}")
    ids = move(idx, _ID_DTYPES)
    off = move(off, _ID_DTYPES)
    psw = None if psw is None else move(psw, (torch.float32,))
    return DeviceBags(ids, off, R - 1 if include_last_offset else R, 0, psw, move.copies, move.conversions, source)
