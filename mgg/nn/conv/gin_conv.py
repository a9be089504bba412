"""GINConv (Xu et al.): out = nn((1 + eps) * x + sum_{j -> i} x_j), on the distributed graph."""
from __future__ import annotations

import torch
from torch import nn

from ..functional import aggregate

__all__ = ["GINConv"]


class GINConv(nn.Module):
    """Graph isomorphism convolution ("sum" aggregation kind).

    Args:
        mlp: the module applied after the aggregation (e.g. Linear-ReLU-Linear).
        eps: initial epsilon. train_eps: make epsilon a learnable parameter.
    Shapes:
        input float32 [n_local, F] -> mlp(float32 [n_local, F]).
    """

    def __init__(self, mlp: nn.Module, eps: float = 0.0, train_eps: bool = False):
        super().__init__()
        self.nn = mlp
        self.initial_eps = eps
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))

    def reset_parameters(self) -> None:
        for m in self.nn.modules():
            if m is not self.nn and hasattr(m, "reset_parameters"):
                m.reset_parameters()
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    def forward(self, x: torch.Tensor, dg) -> torch.Tensor:
        out = (1.0 + self.eps) * x + aggregate(x, dg, "sum")
        return self.nn(out)

    def extra_repr(self) -> str:
        return f"train_eps={isinstance(self.eps, nn.Parameter)}"
