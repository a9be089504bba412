"""Bag pooling (`F.embedding_bag`'s "sum" and "mean") that reads nothing back to the host.

The CUDA backward of `F.embedding_bag` (`_embedding_bag_dense_backward`) reads the number of
distinct indices on the host, so a step that pools with it cannot be captured in a CUDA graph.
Here a bag is pooled with ops of fixed shapes and no host read, forward and backward:

    bag[i]  = the bag of id i: searchsorted(offsets, i, right=True) - 1   (empty bags own no id)
    out     = zeros[B, D].index_add_(0, bag, rows.index_select(0, inv) * per_sample_weights)
    "mean": out / max(bag size, 1)                                           (an empty bag is 0)

The result equals torch's to float rounding: the ids of a bag are added in another order (by
atomics on the GPU; torch's backward sums a row's gradients by sorted segments). "max" has no
such form here: it stays with `F.embedding_bag` (`CAPTURABLE_MODES` says which modes this covers).
"""
from __future__ import annotations

import torch

__all__ = ["CAPTURABLE_MODES", "bag_of_ids", "pool_bags"]

#: the pooling modes `pool_bags` computes
CAPTURABLE_MODES = ("sum", "mean")


def bag_of_ids(offsets: torch.Tensor, n: int, include_last_offset: bool = False) -> torch.Tensor:
    """int64 [n]: the bag of each of n ids from the bags' first ids `offsets` (int [R],
    non-decreasing from 0). Without include_last_offset the last bag runs to the end (bags
    0..R-1); with it offsets[-1] ends the last bag and the ids after it get bag R - 1 (a bag
    that the caller drops). Bad offsets (the checks report them) still give bags in [0, R - 1]."""
    off = offsets.to(torch.int64)
    r = int(off.numel())
    pos = torch.arange(n, dtype=torch.int64, device=off.device)
    if r == 0:
        return torch.zeros(n, dtype=torch.int64, device=off.device)
    return (torch.searchsorted(off, pos, right=True) - 1).clamp_(0, r - 1)


def pool_bags(rows: torch.Tensor, inv: torch.Tensor, offsets: torch.Tensor, mode: str,
              per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False) -> torch.Tensor:
    """`F.embedding_bag(inv, rows, offsets, mode=mode, per_sample_weights=...,
    include_last_offset=...)` for mode "sum" or "mean", differentiable in rows and the weights.

    rows: float [S, D]; inv: int64 [n] each id's row; offsets: int [R] (B = R bags, or R - 1 with
    include_last_offset, where ids after offsets[-1] belong to no bag); per_sample_weights:
    float [n] or None. Returns [B, D] in rows' dtype."""
    if mode not in CAPTURABLE_MODES:
        raise ValueError(f"pooling mode {mode!r} has no capturable form (only {CAPTURABLE_MODES})")
    n, d = int(inv.numel()), int(rows.shape[1])
    r = int(offsets.numel())
    nb = r - 1 if include_last_offset else r
    slots = max(r, 1)  # with include_last_offset bag R - 1 collects the ids after the last bag
    bag = bag_of_ids(offsets, n, include_last_offset)
    vals = rows.index_select(0, inv)
    if per_sample_weights is not None:
        vals = vals * per_sample_weights.to(vals.dtype).unsqueeze(1)
    out = torch.zeros((slots, d), dtype=rows.dtype, device=rows.device).index_add(0, bag, vals)[:nb]
    if mode == "mean" and nb:
        off = offsets.to(torch.int64)
        end = off[1:] if include_last_offset else torch.cat([off[1:], off.new_full((1,), n)])
        size = (end - off[:nb]).clamp(min=1).to(rows.dtype)
        out = out / size.unsqueeze(1)
    return out
