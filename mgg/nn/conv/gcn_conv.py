"""GCNConv (Kipf & Welling): out = D^-1/2 (A + I) D^-1/2 x W + b, on the distributed graph."""
from __future__ import annotations

import torch
from torch import nn

from ...graph.gcn_factors import SCALED_INPUT, WHOLE, GcnFactors
from ..dense import project
from ..epilogue import Epilogue, aggregate_epilogue, apply_epilogue
from ..functional import aggregate, takes_scaled_input
from .base import GraphConv

__all__ = ["GCNConv"]


class GCNConv(GraphConv):
    """Graph convolution with symmetric normalisation ("gcn" aggregation kind).

    The linear map and the aggregation commute, so the aggregation runs on the narrower side:
    linear first when `out_channels <= in_channels`, aggregation first otherwise. The bias is
    added after both.

    Args:
        in_channels, out_channels: feature widths. bias: learn an additive bias.
    Shapes:
        input float32 [n_local, in_channels] -> output float32 [n_local, out_channels], or
        [len(rows), out_channels] with `rows` (a RowSet: only those rows are aggregated).
    """

    supports_rows = True
    #: forward(epilogue=) returns the hidden layer's epilogue(out): the bias, the ReLU and the next
    #: layer's input dropout in one pass after the aggregation, where it ends in one (mgg.nn.epilogue)
    takes_epilogue = True

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @property
    def first_weight(self) -> torch.Tensor | None:
        """The weight applied to the input before anything else (linear first), or None."""
        return self.lin.weight if self.out_channels <= self.in_channels else None

    def input_scale(self, dg) -> torch.Tensor | None:
        """dg.gcn_factor() (float32 [n_local]) where dg takes a table scaled by it natively
        (dg.takes_scaled_input("gcn"); collective on its first call per configuration): its input
        may then come already multiplied by the column factor of the gcn product
        diag(f) (A + I) diag(f), from the op that produced it (the dropout before this conv, the
        previous layer's epilogue), and the aggregation skips its pre-scale pass. Else None."""
        return dg.gcn_factor() if takes_scaled_input(dg, "gcn") else None

    def forward(self, x: torch.Tensor, dg, rows=None, compact: bool = True,
                input_scale: torch.Tensor | None = None, epilogue: Epilogue | None = None) -> torch.Tensor:
        """rows: a RowSet -- only those rows are computed; `compact` returns them alone, else
        [n_local, out] where only they are meaningful (mgg.nn.functional.aggregate).
        input_scale: None, or dg.gcn_factor() (what `input_scale(dg)` returns) when x holds
        input_scale[:, None] * x (the result is that of the unscaled x; the row scale commutes
        with the linear map, so either order takes it).
        epilogue: the output then goes through it (ReLU, dropout, row scale; fused with the
        aggregation when the linear map runs first)."""
        if self.out_channels <= self.in_channels:
            return self.forward_projected(project(x, self.lin.weight), dg, rows, compact, input_scale, epilogue)
        factors = _factors(dg, input_scale)
        return self._finish(self.lin(aggregate(x, dg, "gcn", rows, compact, factors=factors)), epilogue)

    def _finish(self, out: torch.Tensor, epilogue: Epilogue | None) -> torch.Tensor:
        """out + bias, through `epilogue` when given (mgg.nn.epilogue.apply_epilogue: no aggregation
        left to fuse it with)."""
        if epilogue is not None:
            return apply_epilogue(out, self.bias, epilogue)
        return out if self.bias is None else out + self.bias

    def input_aggregation(self) -> tuple[str, int]:
        """(kind, column block) of the aggregation `forward_aggregated` starts from: "gcn", in
        blocks of the width this conv aggregates anyway (mgg.nn.input_cache)."""
        return "gcn", min(self.in_channels, self.out_channels)

    def forward_aggregated(self, agg: torch.Tensor, x: torch.Tensor, dg, rows=None,
                           compact: bool = True, epilogue: Epilogue | None = None) -> torch.Tensor:
        """forward given agg = the "gcn" aggregation of x, float32 [n_local, in_channels]:
        lin(agg) + b, as (A x) W == A (x W)."""
        if rows is not None and compact:
            agg = agg[rows.index]
        return self._finish(self.lin(agg), epilogue)

    def forward_projected(self, h: torch.Tensor, dg, rows=None, compact: bool = True,
                          input_scale: torch.Tensor | None = None,
                          epilogue: Epilogue | None = None) -> torch.Tensor:
        """The rest of forward once the input went through `first_weight` (h = x W^T)."""
        factors = _factors(dg, input_scale)
        if epilogue is not None and not (rows is not None and compact):
            return aggregate_epilogue(h, dg, "gcn", self.bias, epilogue, rows, factors)
        return self._finish(aggregate(h, dg, "gcn", rows, compact, factors=factors), epilogue)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"


def _factors(dg, input_scale: torch.Tensor | None) -> GcnFactors:
    """The part of diag(f) (A + I) diag(f) the aggregation applies: all of it, or, on an input
    already scaled by f = dg.gcn_factor(), diag(f) (A + I) (`SCALED_INPUT`)."""
    if input_scale is None:
        return WHOLE
    if input_scale is not dg.gcn_factor():
        raise ValueError("GCNConv: input_scale must be dg.gcn_factor() (the gcn column factor "
                         "GCNConv.input_scale returns), or None")
    return SCALED_INPUT
