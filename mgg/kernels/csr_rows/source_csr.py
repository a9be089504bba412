"""SourceCsr: a CSR on the GPU that a CsrRowsExecutor runs instead of its plan's local CSR."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .weights import WeightFactors

__all__ = ["SourceCsr"]


@dataclass(frozen=True)
class SourceCsr:
    """A CSR on the GPU that an executor runs instead of its plan's local CSR: the plan's n_local
    rows over a table of `n_src` >= n_local rows whose first n_local rows are this rank's own
    (mgg.kernels.halo_csr's fused pass: own rows, then the halo rows).

    indptr int64 [n_local + 1]; src int32 [E] in [0, n_src); weight float32 [E] (the plan's
    weights, read where the factors do not reproduce them); factors: the WeightFactors of the
    CSR (row factor [n_local], column factor [n_src])."""

    indptr: torch.Tensor
    src: torch.Tensor
    weight: torch.Tensor
    n_src: int
    factors: WeightFactors
