"""SAGEConv (Hamilton et al., mean aggregator): out = lin_l(mean_{j -> i} x_j) + lin_r(x_i)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..dense import project
from ..epilogue import Epilogue, apply_epilogue
from ..functional import aggregate
from ..fused import fused_mean
from .base import GraphConv

__all__ = ["SAGEConv"]


class SAGEConv(GraphConv):
    """GraphSAGE convolution with the "mean" aggregation kind (isolated nodes aggregate to 0).

    `lin_l` carries the bias, `lin_r` (root weight) has none, as in PyG. Mean aggregation is
    linear, so when `out_channels < in_channels` the projection runs before it:
    mean(x) W^T + b == mean(x W^T) + b (also for isolated nodes, where both give b).

    `fused=True` runs the mean through the fused, degree-adaptive executor of GATConv
    (mgg.graph.adaptive, mode "mean": one halo exchange forward, scatter_halo_add backward)
    instead of the plan aggregation with the transposed plan; the result is the same.

    As a hidden layer it takes an `Epilogue` (mgg.nn.epilogue): the root term is added by its
    GEMM (addmm onto the mean), then the bias, the ReLU and the next layer's input dropout run in
    one fused pass each way (apply_epilogue), instead of an add, a bias add, the ReLU and the
    dropout one by one; the same values within float32 rounding (the sum's order differs).

    Shapes:
        input float32 [n_local, in_channels] -> output float32 [n_local, out_channels].
    """

    takes_epilogue = True

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, root_weight: bool = True,
                 fused: bool = False):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.fused = bool(fused)
        self.lin_l = nn.Linear(in_channels, out_channels, bias=bias)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        if self.lin_r is not None:
            self.lin_r.reset_parameters()

    @property
    def supports_rows(self) -> bool:
        """`forward(..., rows=...)` aggregates those rows only (the plan path; not `fused`)."""
        return not self.fused

    def _mean(self, x: torch.Tensor, dg, rows=None, compact: bool = True) -> torch.Tensor:
        return fused_mean(x, dg) if self.fused else aggregate(x, dg, "mean", rows, compact)

    def input_aggregation(self) -> tuple[str, int] | None:
        """(kind, column block) of the aggregation `forward_aggregated` starts from: "mean", in
        blocks of the width this conv aggregates anyway (mgg.nn.input_cache); None when `fused`
        (its executor is not the plan's)."""
        return None if self.fused else ("mean", min(self.in_channels, self.out_channels))

    def forward_aggregated(self, agg: torch.Tensor, x: torch.Tensor, dg, rows=None,
                           compact: bool = True, epilogue: Epilogue | None = None) -> torch.Tensor:
        """forward given agg = mean_{j -> i} x_j, float32 [n_local, in_channels]:
        lin_l(agg) + lin_r(x), as mean(x) W == mean(x W); through `epilogue` when given."""
        if rows is not None and compact:
            agg, x = agg[rows.index], x[rows.index]
        if epilogue is not None:
            return self._epilogue(F.linear(agg, self.lin_l.weight), x, epilogue)
        out = self.lin_l(agg)
        return out if self.lin_r is None else out + self.lin_r(x)

    def _epilogue(self, m: torch.Tensor, root: torch.Tensor, epilogue: Epilogue) -> torch.Tensor:
        """epilogue(m + lin_r(root) + bias): m float32 [rows, out] (the projected mean, no bias),
        root float32 [rows, in] (the rows' own input). The root term in its GEMM (addmm), then one
        fused pass (apply_epilogue: the bias, ReLU, dropout; the unfused chain where the kernels
        do not take the rows)."""
        h = m if self.lin_r is None else torch.addmm(m, root, self.lin_r.weight.t())
        return apply_epilogue(h, self.lin_l.bias, epilogue)

    def forward(self, x: torch.Tensor, dg, rows=None, compact: bool = True,
                epilogue: Epilogue | None = None) -> torch.Tensor:
        """x float32 [n_local, in] -> [n_local, out], or [len(rows), out] with `rows` (a RowSet;
        only when `supports_rows`) and `compact` (else [n_local, out], meaningful at `rows`).
        epilogue: the output then goes through it (ReLU, the next layer's dropout)."""
        if rows is not None and not self.supports_rows:
            raise ValueError("SAGEConv(fused=True) aggregates every row (rows=None)")
        if epilogue is not None:
            root = x[rows.index] if (rows is not None and compact) else x
            if self.out_channels < self.in_channels:
                m = self._mean(project(x, self.lin_l.weight), dg, rows, compact)
            else:
                m = F.linear(self._mean(x, dg, rows, compact), self.lin_l.weight)
            return self._epilogue(m, root, epilogue)
        if self.out_channels < self.in_channels:
            out = self._mean(project(x, self.lin_l.weight), dg, rows, compact)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(self._mean(x, dg, rows, compact))
        if self.lin_r is not None:
            out = out + self.lin_r(x[rows.index] if (rows is not None and compact) else x)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"
