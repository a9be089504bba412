"""Checks of EmbeddingBag inputs, with messages that say what is wrong.

Valid inputs mean exactly what they mean to `torch.nn.EmbeddingBag`: 1-D `indices` with 1-D
`offsets` starting at 0 (non-decreasing, each <= len(indices)), or 2-D `indices` [B, L] with no
offsets (B bags of L); `include_last_offset=True` makes offsets[-1] the end of the last bag;
`per_sample_weights` (float, same shape as indices) only with mode "sum".
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["MODES", "BagInput", "check_bag_input", "as_tensor"]

MODES = ("sum", "mean", "max")


class BagInput:
    """Validated, flattened input of one table: indices int64 [n], offsets int64 [B + 1] (include_last_offset form).

    offsets[0] == 0 and offsets[-1] == n: every index belongs to exactly one bag, so inputs can be
    concatenated into one batch by shifting their offsets."""

    __slots__ = ("indices", "offsets", "per_sample_weights", "num_bags")

    def __init__(self, indices, offsets, per_sample_weights, num_bags):
        self.indices, self.offsets, self.per_sample_weights, self.num_bags = indices, offsets, per_sample_weights, num_bags


def as_tensor(x, what: str) -> torch.Tensor:
    """A tensor, numpy array or list of numbers as a tensor (no copy for a tensor or an array);
    TypeError / ValueError naming `what` for anything else."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError(f"{what}: object arrays are not accepted")
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, (list, tuple)):
        try:
            arr = np.asarray(x)
        except ValueError as e:
            raise ValueError(f"{what}: ragged or malformed list ({e})") from None
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise TypeError(f"{what}: expected numbers, got {arr.dtype}")
        if arr.size == 0:
            arr = arr.astype(np.int64)
        return torch.from_numpy(arr)
    raise TypeError(f"{what}: expected a tensor, array or list, got {type(x).__name__}")


def weights_tensor(per_sample_weights, mode: str, what: str) -> torch.Tensor:
    """per_sample_weights as a floating-point tensor; ValueError unless `mode` is "sum", TypeError
    for integer weights (the table named in `what`)."""
    if mode != "sum":
        raise ValueError(f"{what}: per_sample_weights are only supported with mode='sum', got mode={mode!r}")
    psw = as_tensor(per_sample_weights, f"{what}: per_sample_weights")
    if not psw.is_floating_point():
        raise TypeError(f"{what}: per_sample_weights must be floating point, got {psw.dtype}")
    return psw


def offsets_tensor(offsets, idx: torch.Tensor, what: str) -> torch.Tensor:
    """offsets as a 1-D integer tensor beside 1-D indices `idx`; ValueError / TypeError naming
    the table in `what` otherwise."""
    if idx.dim() != 1:
        raise ValueError(f"{what}: with offsets, indices must be 1-D; got {idx.dim()}-D")
    off = as_tensor(offsets, f"{what}: offsets")
    if off.dtype == torch.bool or off.is_floating_point() or off.is_complex():
        raise TypeError(f"{what}: offsets must be an integer tensor, got {off.dtype}")
    if off.dim() != 1:
        raise ValueError(f"{what}: offsets must be 1-D; got {off.dim()}-D")
    return off


def _summary(idx: torch.Tensor, off: torch.Tensor) -> tuple[int, bool, int, int, int]:
    """(offsets[0], offsets decrease somewhere, offsets[-1], min index, max index) as Python
    values; on a GPU one small device-to-host copy (one synchronisation) for all five."""
    z = torch.zeros((), dtype=torch.int64, device=idx.device)
    parts = [off[0] if off.numel() else z,
             (off[1:] < off[:-1]).any().to(torch.int64) if off.numel() > 1 else z,
             off[-1] if off.numel() else z,
             idx.min() if idx.numel() else z, idx.max() if idx.numel() else z]
    first, dec, last, lo, hi = torch.stack(parts).tolist()
    return first, bool(dec), last, lo, hi


def check_bag_input(indices, offsets, per_sample_weights, *, num_embeddings: int, mode: str,
                    include_last_offset: bool, what: str = "EmbeddingBag",
                    device: torch.device | str | None = None) -> BagInput:
    """Validate one table's input; returns flat int64 indices and offsets [B + 1] (the last = end
    of the last bag) on `device` (None: the CPU). On a GPU the checks run there, with one
    synchronisation for all of them. (The GPU lookup checks inside its kernel instead,
    mgg.embedding.device_input, and calls this only to word the error of a bad input.)"""
    if mode not in MODES:
        raise ValueError(f"{what}: mode must be one of {MODES}, got {mode!r}")
    idx = as_tensor(indices, f"{what}: indices")
    if idx.dtype in (torch.bool,) or idx.is_floating_point() or idx.is_complex():
        raise TypeError(f"{what}: indices must be an integer tensor, got {idx.dtype}")
    if offsets is None:
        if idx.dim() != 2:
            raise ValueError(f"{what}: without offsets, indices must be 2-D [bags, bag_size]; got {idx.dim()}-D")
        b, l = idx.shape
        off = torch.arange(b, dtype=torch.int64) * l
        include_last_offset = False
        idx = idx.reshape(-1)
        if per_sample_weights is not None:
            psw = as_tensor(per_sample_weights, f"{what}: per_sample_weights")
            if psw.shape != (b, l):
                raise ValueError(f"{what}: per_sample_weights must have the shape of indices {(b, l)}, got {tuple(psw.shape)}")
            per_sample_weights = psw.reshape(-1)
    else:
        off = offsets_tensor(offsets, idx, what)
    dev = torch.device("cpu") if device is None else torch.device(device)
    idx = idx.to(device=dev, dtype=torch.int64, non_blocking=True)
    off = off.to(device=dev, dtype=torch.int64, non_blocking=True)
    n = int(idx.numel())
    if include_last_offset and off.numel() == 0:
        raise ValueError(f"{what}: include_last_offset=True needs at least one offset")
    if off.numel() == 0 and not include_last_offset and n:
        # zero bags own no ids: a batch that appends this input to another would hand them to the
        # other input's last bag
        raise ValueError(f"{what}: offsets is empty (0 bags) but indices has {n} entries; "
                         f"every index must belong to a bag (offsets [0] makes one bag)")
    first, decreasing, last, lo, hi = _summary(idx, off)
    if off.numel():
        if first != 0:
            raise ValueError(f"{what}: offsets must start at 0, got offsets[0]={first}")
        if decreasing:
            i = int(torch.nonzero(off[1:] < off[:-1])[0, 0]) + 1
            raise ValueError(f"{what}: offsets must be non-decreasing; offsets[{i}]={int(off[i])} < offsets[{i-1}]={int(off[i-1])}")
        if last > n:
            raise ValueError(f"{what}: offsets[-1]={last} exceeds len(indices)={n}")
    if n:
        if lo < 0 or hi >= num_embeddings:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{what}: index {bad} out of range [0, {num_embeddings})")
    psw = None
    if per_sample_weights is not None:
        psw = weights_tensor(per_sample_weights, mode, what)
        if psw.dim() != 1 or psw.numel() != n:
            raise ValueError(f"{what}: per_sample_weights must be 1-D with len(indices)={n} entries, got shape {tuple(psw.shape)}")
        if device is not None:
            psw = psw.to(dev, non_blocking=True)
    if include_last_offset and last < n:
        # indices after the last offset belong to no bag; dropping them keeps their gradient 0
        # (torch 2.x leaves it uninitialized there when per_sample_weights are given)
        end = last
        idx = idx[:end]
        psw = None if psw is None else psw[:end]
        n = end
    if not include_last_offset:  # normalize: offsets always end with the end of the last bag
        off = torch.cat([off, torch.tensor([n], dtype=torch.int64, device=off.device)])
    return BagInput(idx, off, psw, int(off.numel()) - 1)
