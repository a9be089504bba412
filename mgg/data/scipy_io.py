"""scipy.sparse matrices <-> Graph. Row = target: ``A[i, j] != 0`` is the edge ``j -> i``.

scipy is imported on first use (it takes 0.6 s and more to import, and a run that reads no
scipy matrix never needs it)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .graph import Graph
from .validate import GraphFormatError, validate_graph

if TYPE_CHECKING:
    import scipy.sparse as sp

__all__ = ["from_scipy", "to_scipy"]


def from_scipy(A, x=None, y=None, train_mask=None, val_mask=None, test_mask=None,
               name: str = "scipy", source: str = "<scipy matrix>") -> Graph:
    """Graph from a square scipy sparse matrix/array of any format.

    ``A[i, j] != 0`` means edge ``j -> i`` (row i aggregates column j). Values are discarded
    (explicitly stored zeros are dropped); duplicate entries of a COO input are kept as
    duplicate edges. Node data as in :class:`Graph`.
    """
    import scipy.sparse as sp

    if not sp.issparse(A):
        raise GraphFormatError(source, "matrix", f"expected a scipy sparse matrix, got {type(A).__name__}")
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise GraphFormatError(source, "matrix", f"must be square, got shape {A.shape}")
    if A.format == "coo":
        keep = A.data != 0
        order = np.argsort(A.row[keep], kind="stable")
        rows, cols = A.row[keep][order], A.col[keep][order]
        indptr = np.zeros(A.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=A.shape[0]), out=indptr[1:])
        indices = cols.astype(np.int64)
    else:
        C = A.tocsr(copy=True)
        C.eliminate_zeros()
        indptr, indices = C.indptr.astype(np.int64), C.indices.astype(np.int64)
    g = Graph(indptr, indices, x=x, y=y, train_mask=train_mask, val_mask=val_mask,
              test_mask=test_mask, name=name)
    return validate_graph(g, source)


def to_scipy(graph: Graph, dtype=np.float32) -> sp.csr_matrix:
    """[N, N] CSR matrix with ones (duplicates kept as separate entries, summing on use)."""
    import scipy.sparse as sp

    n = graph.num_nodes
    data = np.ones(graph.num_edges, dtype=dtype)
    return sp.csr_matrix((data, graph.indices, graph.indptr), shape=(n, n))
