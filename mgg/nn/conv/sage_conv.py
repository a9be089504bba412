"""SAGEConv (Hamilton et al., mean aggregator): out = lin_l(mean_{j -> i} x_j) + lin_r(x_i)."""
from __future__ import annotations

import torch
from torch import nn

from ..dense import project
from ..functional import aggregate
from ..fused import fused_mean

__all__ = ["SAGEConv"]


class SAGEConv(nn.Module):
    """GraphSAGE convolution with the "mean" aggregation kind (isolated nodes aggregate to 0).

    `lin_l` carries the bias, `lin_r` (root weight) has none, as in PyG. Mean aggregation is
    linear, so when `out_channels < in_channels` the projection runs before it:
    mean(x) W^T + b == mean(x W^T) + b (also for isolated nodes, where both give b).

    `fused=True` runs the mean through the fused, degree-adaptive executor of GATConv
    (mgg.kernels.adaptive, mode "mean": one halo exchange forward, scatter_halo_add backward)
    instead of the plan aggregation with the transposed plan; the result is the same.

    Shapes:
        input float32 [n_local, in_channels] -> output float32 [n_local, out_channels].
    """

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
                           compact: bool = True) -> torch.Tensor:
        """forward given agg = mean_{j -> i} x_j, float32 [n_local, in_channels]:
        lin_l(agg) + lin_r(x), as mean(x) W == mean(x W)."""
        if rows is not None and compact:
            agg, x = agg[rows.index], x[rows.index]
        out = self.lin_l(agg)
        return out if self.lin_r is None else out + self.lin_r(x)

    def forward(self, x: torch.Tensor, dg, rows=None, compact: bool = True) -> torch.Tensor:
        """x float32 [n_local, in] -> [n_local, out], or [len(rows), out] with `rows` (a RowSet;
        only when `supports_rows`) and `compact` (else [n_local, out], meaningful at `rows`)."""
        if rows is not None and not self.supports_rows:
            raise ValueError("SAGEConv(fused=True) aggregates every row (rows=None)")
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
