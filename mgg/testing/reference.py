"""Float64 single-process reference of the aggregation, independent of partitions and plans.

Used by tests as ground truth and by nothing on the hot path. It builds the weighted sparse
matrix of docs/architecture.md with scipy and multiplies in float64.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["aggregation_matrix", "dense_aggregation_matrix", "aggregate_reference", "edge_weights", "self_weights",
           "KINDS"]

KINDS = ("sum", "mean", "gcn", "sum_self")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown aggregation kind {kind!r}; expected one of {KINDS}")


def edge_weights(indptr: np.ndarray, indices: np.ndarray, kind: str) -> np.ndarray:
    """Per-edge weights (float64 [E]) of `kind` for CSR rows = targets, in CSR order.

    `sum`: 1; `mean`: 1/deg_in(target); `gcn`: dinv[target] * dinv[source] with
    dinv = (deg_in + 1) ** -0.5 over the whole graph (duplicates count).
    """
    _check_kind(kind)
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    deg = np.diff(indptr).astype(np.float64)
    target = np.repeat(np.arange(len(deg), dtype=np.int64), np.diff(indptr))
    if kind in ("sum", "sum_self"):
        return np.ones(len(indices), dtype=np.float64)
    if kind == "mean":
        return 1.0 / deg[target]
    dinv = (deg + 1.0) ** -0.5
    return dinv[target] * dinv[indices]


def self_weights(indptr: np.ndarray, kind: str) -> np.ndarray | None:
    """Diagonal (self-loop) weights (float64 [N]) of `kind`, or None when it has no self term."""
    _check_kind(kind)
    if kind == "sum_self":
        return np.ones(len(indptr) - 1, dtype=np.float64)
    if kind != "gcn":
        return None
    deg = np.diff(np.asarray(indptr, dtype=np.int64)).astype(np.float64)
    return 1.0 / (deg + 1.0)


def aggregation_matrix(indptr: np.ndarray, indices: np.ndarray, kind: str) -> sp.csr_matrix:
    """The N x N float64 matrix W (+ diag) with out = W @ x."""
    n = len(indptr) - 1
    w = edge_weights(indptr, indices, kind)
    m = sp.csr_matrix((w, np.asarray(indices, np.int64), np.asarray(indptr, np.int64)), shape=(n, n))
    d = self_weights(indptr, kind)
    if d is not None:
        m = m + sp.diags(d)
    return m.tocsr()


def dense_aggregation_matrix(indptr: np.ndarray, indices: np.ndarray, kind: str):
    """aggregation_matrix(indptr, indices, kind) as a dense torch float64 [N, N] tensor."""
    import torch

    return torch.from_numpy(aggregation_matrix(indptr, indices, kind).toarray())


def aggregate_reference(indptr: np.ndarray, indices: np.ndarray, x: np.ndarray, kind: str,
                        transposed: bool = False) -> np.ndarray:
    """out = W x (or W^T x when `transposed`), float64 [N, D]."""
    m = aggregation_matrix(indptr, indices, kind)
    if transposed:
        m = m.T.tocsr()
    return np.asarray(m @ np.asarray(x, dtype=np.float64))
