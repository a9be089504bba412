"""Edge weights of the aggregation kinds, for one rank's rows of the global CSR.

Kinds (docs/architecture.md): `sum` w = 1; `mean` w = 1/deg_in(target); `gcn`
w = dinv[target] * dinv[source], diag = dinv^2, dinv = (deg_in + 1)^-1/2 over the global graph.
"""
from __future__ import annotations

import numpy as np

__all__ = ["KINDS", "check_kind", "pair_weights", "diag_weights"]

KINDS = ("sum", "mean", "gcn")


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown aggregation kind {kind!r}; expected one of {', '.join(KINDS)}")


def pair_weights(kind: str, deg_in: np.ndarray, target: np.ndarray, source: np.ndarray) -> np.ndarray:
    """float32 [k] weights of edges source[k] -> target[k] (global ids); deg_in: int64 [N]."""
    check_kind(kind)
    if kind == "sum":
        return np.ones(len(target), dtype=np.float32)
    if kind == "mean":
        return (1.0 / np.maximum(deg_in[target], 1)).astype(np.float32)
    dinv = 1.0 / np.sqrt(deg_in.astype(np.float64) + 1.0)
    return (dinv[target] * dinv[source]).astype(np.float32)


def diag_weights(kind: str, deg_in: np.ndarray, nodes: np.ndarray) -> np.ndarray | None:
    """float32 [k] self-term weights of `nodes`, or None for kinds without a self term."""
    check_kind(kind)
    if kind != "gcn":
        return None
    return (1.0 / (deg_in[nodes].astype(np.float64) + 1.0)).astype(np.float32)
