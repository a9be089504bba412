"""GINConv (Xu et al.): out = nn((1 + eps) * x + sum_{j -> i} x_j), on the distributed graph."""
from __future__ import annotations

import torch
from torch import nn

from ..dense import linear, linear_relu, linear_with_stats, project
from ..functional import aggregate
from ..norm_linear import fuses as norm_linear_fuses
from ..norm_linear import norm_relu_linear
from .base import GraphConv

__all__ = ["GINConv"]


def _modules(mlp: nn.Module) -> list[nn.Module]:
    """The MLP as a list of stages (a Sequential's children, or the module itself)."""
    return list(mlp) if isinstance(mlp, nn.Sequential) else [mlp]


def _norm_takes_stats(stages: list[nn.Module], k: int, h: torch.Tensor, dg, cut: int,
                      relu_out: bool = False) -> bool:
    """Whether stage k, a norm reading the output of the Linear at k - 1 (whose input is h), takes
    that Linear's column statistics (`takes_stats` and `uses_local_stats` for rows of its width
    on h's device, with the ReLU after it when one follows -- or, last, with `relu_out` -- and
    `rows=` when k is the cut)."""
    if k >= len(stages):
        return False
    norm, lin = stages[k], stages[k - 1]
    if not getattr(norm, "takes_stats", False):
        return False
    follows = isinstance(stages[k + 1], nn.ReLU) if k + 1 < len(stages) else relu_out
    relu = getattr(norm, "takes_relu", False) and follows
    out = h.new_empty(0, lin.out_features)  # no data: what the Linear writes, for its shape and place
    return norm.uses_local_stats(out, dg, relu, rows=k == cut and getattr(norm, "takes_rows", False))


def _run(stages: list[nn.Module], h: torch.Tensor, dg, relu_out: bool = False, fuse: bool = True,
         out_rows: torch.Tensor | None = None, fuse_norm: bool = True) -> torch.Tensor:
    """Apply `stages` in order, then a ReLU when `relu_out`. A stage with `needs_graph = True`
    (DistBatchNorm) also gets `dg`, and one with `takes_relu = True` followed by an `nn.ReLU`
    runs that ReLU itself (`stage(h, dg, relu=True)`: one fused kernel on a GPU,
    mgg.kernels.norm_relu). With `fuse`, an `nn.Linear` followed by an `nn.ReLU` (or last, with
    `relu_out`) runs as `linear_relu`: the ReLU in the GEMM's epilogue, no pass of its own; any
    other `nn.Linear` as mgg.nn.dense.linear (the tall-GEMM kernel on tall CUDA rows); one followed
    by a norm that `takes_stats` (DistBatchNorm) and would use them (`uses_local_stats`: training
    on its GPU path) as linear_with_stats, whose column statistics the norm then uses instead of
    reading the rows for them. With `fuse_norm` too, a norm + ReLU followed by an `nn.Linear`
    (then a ReLU, or last with `relu_out`) runs as mgg.nn.norm_linear.norm_relu_linear where it
    `fuses`: the norm applied in the GEMM's prologue, its output never written.

    `out_rows` (int64 [k] distinct rows of h): return only those rows. The stages up to the last
    one that needs the graph run on every row (batch statistics are over all nodes); that stage
    writes only the k rows (`stage(h, dg, rows=out_rows)` where it `takes_rows`, else it is
    sliced after), and the stages after it run on the k rows alone."""
    cut = -1
    if out_rows is not None:
        cut = max((k for k, m in enumerate(stages) if getattr(m, "needs_graph", False)), default=-1)
        if cut < 0:
            h = h[out_rows]
    i = 0
    stats = None  # the column statistics the last Linear computed for the norm after it
    while i < len(stages):
        m = stages[i]
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        rows_kw = {"rows": out_rows} if i == cut and getattr(m, "takes_rows", False) else {}
        kw = dict(rows_kw, local_stats=stats) if stats is not None else rows_kw
        stats = None
        if fuse and type(m) is nn.Linear and (isinstance(nxt, nn.ReLU) or (nxt is None and relu_out)):
            h = linear_relu(h, m.weight, m.bias)
            if nxt is None:
                relu_out = False  # done in the epilogue
            i += 2 if nxt is not None else 1
        elif fuse and type(m) is nn.Linear and _norm_takes_stats(stages, i + 1, h, dg, cut, relu_out):
            h, stats = linear_with_stats(h, m.weight, m.bias, nxt.stats_shift(h.device))
            i += 1
        elif fuse and type(m) is nn.Linear:
            h, i = linear(h, m.weight, m.bias), i + 1
        elif not getattr(m, "needs_graph", False):
            h, i = m(h), i + 1
        elif fuse and fuse_norm and getattr(m, "takes_relu", False) and isinstance(nxt, nn.ReLU) \
                and not rows_kw and i + 2 < len(stages) and norm_linear_fuses(m, h, dg, stages[i + 2]):
            after = stages[i + 3] if i + 3 < len(stages) else None
            relu_after = isinstance(after, nn.ReLU) or (after is None and relu_out)
            h = norm_relu_linear(m, h, dg, stages[i + 2], relu_after, local_stats=kw.get("local_stats"))
            if after is None:
                relu_out = False  # done in the epilogue (relu_after was relu_out)
            i += 4 if isinstance(after, nn.ReLU) else 3
        elif getattr(m, "takes_relu", False) and isinstance(nxt, nn.ReLU):
            h, i = m(h, dg, relu=True, **kw), i + 2
        elif getattr(m, "takes_relu", False) and nxt is None and relu_out:  # the last norm runs relu_out
            h, i, relu_out = m(h, dg, relu=True, **kw), i + 1, False
        else:
            h, i = m(h, dg, **kw), i + 1
        if cut >= 0 and i > cut and not rows_kw and out_rows is not None:
            h, cut = h[out_rows], -1  # a stage that writes every row: sliced after it
        elif rows_kw:
            cut = -1
    return torch.relu(h) if relu_out else h


class GINConv(GraphConv):
    """Graph isomorphism convolution ("sum_self" aggregation kind: (A + I) x, the node's own row
    summed inside the aggregation kernel; eps x is added after it when eps is learnt or nonzero),
    optionally followed by a norm of its output (`norm`; the normalisation PyG's GIN model
    applies after every hidden convolution), run as one more stage after the MLP.

    When the MLP starts with an `nn.Linear` W (+ b) that narrows the features (out < in), the
    weight is applied before the sum, which is linear:
    W((1 + eps) x_i + sum_j x_j) + b == (1 + eps) W x_i + sum_j W x_j + b,
    so the aggregation moves out-wide rows instead of in-wide ones; the bias is added after it.
    Otherwise the sum runs on the input and the whole MLP follows (as in PyG). Both orders give
    the same result up to float rounding. Stages of the MLP with `needs_graph = True`
    (mgg.nn.norm.DistBatchNorm) are called as `stage(h, dg)`.

    Every forward takes `relu_out=True` to return relu(mlp(...)) (the activation a model applies
    after this conv): when the MLP ends with an `nn.Linear`, the ReLU runs in that GEMM's
    epilogue (`takes_relu_out`; mgg.nn.dense.linear_relu), as does a ReLU inside the MLP that
    follows a Linear.

    Args:
        mlp: the module applied after the aggregation (e.g. Linear-ReLU-Linear).
        eps: initial epsilon. train_eps: make epsilon a learnable parameter.
        norm: a module applied to mlp's output (e.g. DistBatchNorm), or None.
    Attributes:
        fuse_relu: False runs every Linear and ReLU as separate steps (benchmarks, A/B).
        fuse_norm_linear: False keeps a batch norm + ReLU and the Linear after it as two steps
            (mgg.nn.norm_linear; benchmarks, A/B).
    Shapes:
        input float32 [n_local, F] -> mlp(float32 [n_local, F]).
    """

    #: forwards take `relu_out` (mgg.nn.models.GNN passes it instead of applying its ReLU)
    takes_relu_out = True

    def __init__(self, mlp: nn.Module, eps: float = 0.0, train_eps: bool = False, norm: nn.Module | None = None):
        super().__init__()
        self.nn = mlp
        self.norm = norm
        self.initial_eps = eps
        self.fuse_relu = True
        self.fuse_norm_linear = True
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))

    def reset_parameters(self) -> None:
        for m in self.nn.modules():
            if m is not self.nn and hasattr(m, "reset_parameters"):
                m.reset_parameters()
        if hasattr(self.nn, "reset_parameters"):
            self.nn.reset_parameters()
        if self.norm is not None and hasattr(self.norm, "reset_parameters"):
            self.norm.reset_parameters()
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A loaded fixed eps becomes the host value `_sum` tests (no device read per forward)."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if not isinstance(self.eps, nn.Parameter) and prefix + "eps" in state_dict:
            self.initial_eps = float(state_dict[prefix + "eps"].reshape(-1)[0])

    @property
    def supports_rows(self) -> bool:
        """Whether `forward(..., rows=...)` may run the MLP on those rows only: not with a stage
        that needs the graph (DistBatchNorm's statistics are over every node)."""
        return not any(getattr(m, "needs_graph", False) for m in self._stages())

    #: forwards take `rows` with compact=True whatever the MLP: with batch norm every row is
    #: aggregated and normalised, and only the stages after the norm run on the rows alone
    supports_output_rows = True

    @property
    def projects_first(self) -> bool:
        """True when the MLP's first Linear runs before the aggregation (it narrows the rows)."""
        first = _modules(self.nn)[0]
        return isinstance(first, nn.Linear) and first.out_features < first.in_features

    def forward(self, x: torch.Tensor, dg, rows=None, compact: bool = True, relu_out: bool = False) -> torch.Tensor:
        """x float32 [n_local, F] -> [n_local, out], or [len(rows), out] with `rows` (a RowSet)
        and `compact` (else [n_local, out], meaningful at `rows`; only when `supports_rows`);
        relu of it with `relu_out`."""
        stages = self._stages()
        if self.projects_first:
            return self.forward_projected(project(x, stages[0].weight), dg, rows, compact, relu_out)
        agg_rows, out_rows = self._row_split(rows, compact)
        return _run(stages, self._sum(x, dg, agg_rows, compact), dg, relu_out, self.fuse_relu, out_rows,
                    self.fuse_norm_linear)

    def _row_split(self, rows, compact: bool):
        """(the rows to aggregate, the rows the MLP's graph-wide stage writes): (rows, None) when
        the MLP runs on rows alone (`supports_rows`); with batch norm (None, rows.index): every row
        is aggregated and normalised with all-row statistics, the rest of the MLP runs on `rows`
        (`compact` only: the others would be missing, not merely stale)."""
        if rows is None or self.supports_rows:
            return rows, None
        if not compact:
            raise ValueError("GINConv: an MLP with batch norm computes every row of an inner layer (rows only "
                             "with compact=True, the last layer)")
        return None, rows.index

    def input_aggregation(self) -> tuple[str, int | None]:
        """(kind, column block) of the aggregation `forward_aggregated` starts from: "sum_self",
        in blocks of the width this conv aggregates anyway (the first Linear's output when it
        projects first, else the input's; mgg.nn.input_cache)."""
        return "sum_self", (_modules(self.nn)[0].out_features if self.projects_first else None)

    def forward_aggregated(self, agg: torch.Tensor, x: torch.Tensor, dg, rows=None,
                           compact: bool = True, relu_out: bool = False) -> torch.Tensor:
        """forward given agg = (A + I) x, float32 [n_local, F]: the whole MLP on
        agg + eps x (eps x only when eps is learnt or nonzero), as W (A + I) x == (A + I) x W."""
        agg_rows, out_rows = self._row_split(rows, compact)
        own = x
        if agg_rows is not None and compact:
            agg, own = agg[agg_rows.index], x[agg_rows.index]
        if isinstance(self.eps, nn.Parameter) or self.initial_eps != 0.0:
            agg = agg + self.eps * own
        return _run(self._stages(), agg, dg, relu_out, self.fuse_relu, out_rows, self.fuse_norm_linear)

    def _sum(self, x: torch.Tensor, dg, rows, compact: bool) -> torch.Tensor:
        """(1 + eps) x_i + sum_j x_j as (A + I) x ("sum_self", one kernel), plus eps x_i only when
        eps is learnt or nonzero (a fixed eps is known on the host: no device read)."""
        out = aggregate(x, dg, "sum_self", rows, compact)
        if isinstance(self.eps, nn.Parameter) or self.initial_eps != 0.0:
            own = x[rows.index] if (rows is not None and compact) else x
            out = out + self.eps * own
        return out

    def _stages(self) -> list[nn.Module]:
        """The MLP's stages, then the norm after it (when given)."""
        return _modules(self.nn) + ([self.norm] if self.norm is not None else [])

    @property
    def first_weight(self) -> torch.Tensor | None:
        """The MLP's first Linear weight when it runs before the sum (`projects_first`), or None."""
        return _modules(self.nn)[0].weight if self.projects_first else None

    def forward_projected(self, h: torch.Tensor, dg, rows=None, compact: bool = True,
                          relu_out: bool = False) -> torch.Tensor:
        """The rest of forward once the input went through `first_weight` (h = x W^T)."""
        agg_rows, out_rows = self._row_split(rows, compact)
        lin, rest = self._stages()[0], self._stages()[1:]
        out = self._sum(h, dg, agg_rows, compact)
        if lin.bias is not None:
            out = out + lin.bias
        return _run(rest, out, dg, relu_out, self.fuse_relu, out_rows, self.fuse_norm_linear)

    def extra_repr(self) -> str:
        return f"train_eps={isinstance(self.eps, nn.Parameter)}, projects_first={self.projects_first}"
