"""The training loss: summed cross entropy of the rows a step trains on."""
from __future__ import annotations

import torch

__all__ = ["cross_entropy_sum"]


def cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """F.cross_entropy(logits, target, reduction="sum"), as -sum(log_softmax(logits)[i, target[i]]).

    logits float [k, C], target int64 [k] with values in [0, C) (mgg's masks select labelled rows
    only, mgg.data.validate) -> a 0-dim tensor of logits' dtype. `weight` (float [k] or None):
    row i's term is multiplied by weight[i] (0 leaves a padding row out of the sum and its
    gradient). Why not F.cross_entropy: its summed nll_loss runs in one thread block, forward
    and backward (0.18 + 0.20 ms at [196,615, 47] on an H200, a step's whole loss), where
    log_softmax, a gather and a sum take a few microseconds each. The gradient is autograd's:
    softmax - one_hot(target)."""
    if logits.dim() != 2 or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"cross_entropy_sum: logits [k, C] and target [k] expected, got "
                         f"{tuple(logits.shape)} and {tuple(target.shape)}")
    if weight is not None and weight.shape != target.shape:
        raise ValueError(f"cross_entropy_sum: weight must be [{target.shape[0]}], got {tuple(weight.shape)}")
    picked = torch.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
    if weight is not None:
        picked = picked * weight.to(picked.dtype)
    return -picked.sum()
