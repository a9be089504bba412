"""A hidden layer's epilogue fused with the aggregation before it.

mgg.nn.models.GNN runs, between two convolutions, the first one's bias add, the ReLU, and the
second one's input dropout (times its gcn column factor, where the second conv takes a scaled
input). Each is a pass over [n_local, D] forward and backward, and the backward adds one more:
the bias gradient's column sum, and the transposed aggregation's pre-scale pass. A conv that
ends in an aggregation and a bias (GCNConv, linear first) takes these as an `Epilogue` instead:

    forward   a = aggregate(x);  out = ((relu(a + b) * keep) * scale) * rs     one pass after a
    backward  (g' f, db) from (g, a) in one pass; then the transposed aggregation of g' f as a
              scaled input (mgg.graph.gcn_factors): no pre-scale pass

(mgg/kernels/bias_relu_dropout.cu, float32 CUDA rows it takes). out and the gradient of x are the
same bits as the unfused chain; the bias gradient is summed in another order. Without an
aggregation before it (`apply_epilogue`) the same kernels run the epilogue alone. Everywhere else
(CPU, other widths) `epilogue_reference` runs the unfused chain itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph.gcn_factors import WHOLE, GcnFactors
from .functional import aggregate, aggregate_args, seeded_dropout, takes_scaled_input

__all__ = ["Epilogue", "apply_epilogue", "epilogue_reference", "aggregate_epilogue", "AggregateEpilogue",
           "BiasReluDropout", "fuses"]


@dataclass(frozen=True)
class Epilogue:
    """relu(h + bias), then the next layer's input dropout and row scale.

    Attributes:
        p: drop probability in [0, 1); 0: no dropout (seed unused).
        seed: the dropout seed, drawn (mgg.nn.functional.draw_seed) where the next layer's
            global_dropout would have drawn it: an int, or a DeviceSeeds int64 CUDA tensor.
        row0: the global id of this rank's row 0 (the dropout mask's rows: dg.lo).
        row_scale: None, or float32 [n_local] on the rows' device, each output row's factor (the
            next conv's gcn column factor: its input is then a scaled input).
    """

    p: float = 0.0
    seed: int | torch.Tensor | None = None
    row0: int = 0
    row_scale: torch.Tensor | None = None


def epilogue_reference(h: torch.Tensor, bias: torch.Tensor | None, epi: Epilogue) -> torch.Tensor:
    """The unfused chain on any device: h float [n, D] -> relu(h + bias), dropped and scaled as
    `epi` says, float [n, D] (differentiable; what the fused kernels compute)."""
    y = torch.relu(h if bias is None else h + bias)
    if epi.p > 0.0:
        return seeded_dropout(y, epi.p, epi.seed, epi.row0, epi.row_scale)
    return y if epi.row_scale is None else y * epi.row_scale.to(y.dtype).unsqueeze(1)


class BiasReluDropout(torch.autograd.Function):
    """out = epilogue(h + bias) by the fused kernels, one pass each way (no aggregation before it:
    e.g. GCNConv.forward_aggregated, from the input's cached aggregation)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, bias: torch.Tensor | None, epi: Epilogue) -> torch.Tensor:  # type: ignore[override]
        from ..kernels.bias_relu_dropout import brd_forward

        h = h.detach().contiguous()
        b = None if bias is None else bias.detach()
        ctx.epi = epi
        ctx.save_for_backward(h, b)
        return brd_forward(h, b, epi.p, epi.seed, epi.row0, epi.row_scale)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        from ..kernels.bias_relu_dropout import brd_backward

        h, b = ctx.saved_tensors
        epi = ctx.epi
        g, db = brd_backward(grad_out.contiguous(), h, b, epi.p, epi.seed, epi.row0, epi.row_scale)
        return g, (db if ctx.needs_input_grad[1] else None), None


def apply_epilogue(h: torch.Tensor, bias: torch.Tensor | None, epi: Epilogue) -> torch.Tensor:
    """h float [n, D] -> relu(h + bias), dropped and scaled as `epi` says, float [n, D]
    (differentiable): the fused kernels where they take h (`fuses`), else `epilogue_reference`."""
    if fuses(h):
        return BiasReluDropout.apply(h, bias, epi)
    return epilogue_reference(h, bias, epi)


class AggregateEpilogue(torch.autograd.Function):
    """out = epilogue(aggregate(x) + bias), one aggregation and one fused pass each way. Collective
    (the backward's transposed aggregation too, as mgg.nn.functional.Aggregate)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor | None, dg, kind: str, rows,  # type: ignore[override]
                factors: GcnFactors, epi: Epilogue) -> torch.Tensor:
        from ..kernels.bias_relu_dropout import brd_forward

        a = dg.aggregate(x.detach().contiguous(), kind, **aggregate_args(rows, factors))
        b = None if bias is None else bias.detach()
        ctx.dg, ctx.kind, ctx.rows, ctx.factors, ctx.epi = dg, kind, rows, factors, epi
        ctx.save_for_backward(a, b)
        return brd_forward(a, b, epi.p, epi.seed, epi.row0, epi.row_scale)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        from ..kernels.bias_relu_dropout import brd_backward

        a, b = ctx.saved_tensors
        dg, epi = ctx.dg, ctx.epi
        # the transposed aggregation's column factor into this pass where it takes a scaled input
        fold = ctx.kind == "gcn" and takes_scaled_input(dg, "gcn", ctx.rows)
        g, db = brd_backward(grad_out.contiguous(), a, b, epi.p, epi.seed, epi.row0, epi.row_scale,
                             dg.gcn_factor() if fold else None)
        factors = ctx.factors.transpose()  # d a / d x = diag(f)^r (A + I) diag(f)^c (Aggregate.backward)
        if fold:
            factors = factors.on_scaled_input()
        grad_x = dg.aggregate(g, ctx.kind, transposed=True, **aggregate_args(ctx.rows, factors))
        return grad_x, (db if ctx.needs_input_grad[1] else None), None, None, None, None, None


def fuses(h: torch.Tensor) -> bool:
    """Whether the fused kernels take rows like h (float32 CUDA [n, D], D = 4 * 2^k <= 1024)."""
    from ..kernels.bias_relu_dropout import supports

    return supports(h)


def aggregate_epilogue(x: torch.Tensor, dg, kind: str, bias: torch.Tensor | None, epi: Epilogue,
                       rows=None, factors: GcnFactors = WHOLE) -> torch.Tensor:
    """epilogue(aggregate(x, dg, kind, rows, compact=False, factors) + bias): x float32
    [n_local, D] -> float32 [n_local, D] (with `rows`, only the rows of the set are meaningful;
    `factors`: mgg.nn.functional.aggregate). Fused where the kernels take the rows (`fuses`),
    else the unfused chain."""
    if fuses(x):
        return AggregateEpilogue.apply(x, bias, dg, kind, rows, factors, epi)
    return epilogue_reference(aggregate(x, dg, kind, rows, compact=False, factors=factors), bias, epi)
