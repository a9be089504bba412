"""The gcn kind as diagonal and sparse factors, and the part of it one aggregation call applies.

The gcn aggregation (W plus its self term) is the product

    W = diag(f) (A + I) diag(f),        f = DistGraph.gcn_factor() = (deg_in + 1)^-1/2

(float32 [n_local], this rank's nodes). A producer that writes the table x already multiplied by f
(a dropout, a hidden layer's epilogue: mgg.nn) leaves the call diag(f) (A + I) to apply; the
backward of that call is the transposed product without the row factor. `GcnFactors` names which
of the two diagonal factors a call applies, and composes: `transpose()` gives the factors of the
backward call, `on_scaled_input()` those of a call whose input already holds f * x.

`run_factored` is the one place that turns the value into the launch arguments of the executors
(`scaled_input`, `row_factor` of mgg.kernels.csr_rows / halo_csr), or, where they do not take a
scaled table natively, into a division by f around the plain call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["GcnFactors", "WHOLE", "SCALED_INPUT", "run_factored"]


@dataclass(frozen=True)
class GcnFactors:
    """Which diagonal factors of W = diag(f) (A + I) diag(f) an aggregation call applies.

    Attributes:
        row: the call multiplies its output by f (diag(f) on the left). False: the output is
            (A + I) diag(f) x, the backward of a call on a scaled input.
        column: the call multiplies its input by f (diag(f) on the right). False: the input
            already holds f * x (its producer folded the factor in), the call applies
            diag(f) (A + I) only.

    The whole product (both True, `WHOLE`) is the plain call of any kind; a partial one applies to
    the gcn kind only. A transposed call's factors are those of W^T = diag(f) (A + I)^T diag(f).
    """

    row: bool = True
    column: bool = True

    @property
    def whole(self) -> bool:
        """Both factors: the kind's whole aggregation, the plain call."""
        return self.row and self.column

    def transpose(self) -> "GcnFactors":
        """The factors of this call's transpose, (diag(f)^r (A + I) diag(f)^c)^T =
        diag(f)^c (A + I)^T diag(f)^r: what the backward of this call applies."""
        return GcnFactors(row=self.column, column=self.row)

    def on_scaled_input(self) -> "GcnFactors":
        """These factors for an input its producer already multiplied by f (no column factor)."""
        return GcnFactors(row=self.row, column=False)

    def __str__(self) -> str:
        return f"{'diag(f) ' if self.row else ''}(A + I){' diag(f)' if self.column else ''}"


#: the whole gcn product: the plain call
WHOLE = GcnFactors()
#: the call on a table its producer multiplied by f: diag(f) (A + I)
SCALED_INPUT = GcnFactors(column=False)


def run_factored(executor: Callable[..., torch.Tensor], x: torch.Tensor, sym, factors: GcnFactors,
                 native: bool, gcn_factor: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The executor's aggregation of x with `factors` (a partial one: `factors.whole` is False).

    native: the executors of the call take a scaled table on every rank (csr_rows, halo_csr:
        DistGraph.takes_scaled_input); then the factors become their launch arguments. Otherwise
        the plain call runs on x / f (no column factor) and its output is divided by f (no row
        factor).
    gcn_factor: returns f, float32 [n_local] on x's device (built on first use).
    x: float [n_local, D]. Returns float [n_local, D], x's dtype.
    """
    if native:
        return executor(x, sym, scaled_input=not factors.column, row_factor=factors.row)
    f = gcn_factor().to(x.dtype).unsqueeze(1)
    out = executor(x if factors.column else x / f, sym)
    return out if factors.row else out / f
