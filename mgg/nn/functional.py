"""Differentiable distributed aggregation and a partition-independent dropout.

Both functions take a `DistGraph` (mgg.runtime) and work on this rank's rows only: tensors are
float32 [n_local, D] on `dg.device`. Every rank must call them in the same order (they are
collective, and so is the backward of `aggregate`).
"""
from __future__ import annotations

import torch

__all__ = ["Aggregate", "aggregate", "global_dropout"]


class Aggregate(torch.autograd.Function):
    """out = W x (+ diag * x) over the distributed graph; backward: grad_x = W^T grad_out (+ diag).

    The forward runs the plan of `kind`, the backward the transposed plan (reverse graph), both
    collectives: autograd visits the Aggregate nodes of identical graphs in the same order on
    every rank, so the backward exchanges match up.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dg, kind: str) -> torch.Tensor:  # type: ignore[override]
        ctx.dg = dg
        ctx.kind = kind
        return dg.aggregate(x.detach().contiguous(), kind)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_x = ctx.dg.aggregate(grad_out.contiguous(), ctx.kind, transposed=True)
        return grad_x, None, None


def aggregate(x: torch.Tensor, dg, kind: str) -> torch.Tensor:
    """Differentiable `dg.aggregate(x, kind)`.

    Args:
        x: float [n_local, D], this rank's node rows.
        dg: the DistGraph.
        kind: "sum" | "mean" | "gcn" (see docs/architecture.md).
    Returns:
        float [n_local, D].
    """
    return Aggregate.apply(x, dg, kind)


def global_dropout(x: torch.Tensor, p: float, dg, generator: torch.Generator | None,
                   training: bool = True) -> torch.Tensor:
    """Dropout whose mask does not depend on the partition.

    The keep-mask is drawn for the whole graph (bool [num_nodes, D]) from `generator`, which every
    rank seeds identically and advances identically, and rows [lo, hi) are used here. P ranks
    therefore drop exactly the entries a 1-rank run drops, and reproduce its training.

    Args:
        x: float [n_local, D]. p: drop probability in [0, 1). generator: CPU generator (None:
        torch's default generator, which is only partition-independent if seeded identically).
    Returns:
        float [n_local, D]: x * mask / (1 - p), or x when not training or p == 0.
    """
    if not training or p <= 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    u = torch.rand((dg.num_nodes, x.shape[1]), generator=generator)
    keep = dg.local(u).to(x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)
