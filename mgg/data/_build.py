"""Shared construction step of the loaders: checked edge list + node data -> validated Graph."""
from __future__ import annotations

import dataclasses

import numpy as np

from .graph import Graph, csr_from_edges
from .validate import GraphFormatError, _as_int64, _check_ids, _check_indptr, validate_node_data


def infer_num_nodes(num_nodes, src, dst, x=None, y=None, masks=(), source: str = "?") -> int:
    """N from, in order: an explicit ``num_nodes``, rows of ``x``, length of ``y`` or a mask,
    else ``max(id) + 1``."""
    if num_nodes is not None:
        n = np.asarray(num_nodes)
        if n.size != 1 or n.dtype.kind not in "iu":
            raise GraphFormatError(source, "num_nodes", f"must be one integer, got {num_nodes!r}")
        return int(n.reshape(()))
    for field, a in (("x", x), ("y", y), *zip(("train_mask", "val_mask", "test_mask"), masks)):
        if a is not None:
            a = np.asarray(a)
            if a.ndim == 0:
                raise GraphFormatError(source, field, f"must have one entry per node, got a scalar {a!r}")
            return int(a.shape[0])
    hi = -1
    for a in (src, dst):
        if len(a):
            hi = max(hi, int(a.max()))
    return hi + 1


def graph_from_edges(src, dst, *, source: str, name: str, num_nodes=None, field: str = "edge_index",
                     x=None, y=None, train_mask=None, val_mask=None, test_mask=None,
                     user_ids=None, to_undirected: bool = False) -> Graph:
    """Build and validate a Graph from edges ``src[k] -> dst[k]`` (ids checked before use)."""
    src = _as_int64(src, source, field)
    dst = _as_int64(dst, source, field)
    if src.shape != dst.shape or src.ndim != 1:
        raise GraphFormatError(source, field, f"sources {src.shape} and targets {dst.shape} must be equal 1-D shapes")
    n = infer_num_nodes(num_nodes, src, dst, x, y, (train_mask, val_mask, test_mask), source)
    if n <= 0:
        raise GraphFormatError(source, "num_nodes", "empty graph: 0 nodes")
    _check_ids(src, n, source, f"{field}[0]")
    _check_ids(dst, n, source, f"{field}[1]")
    indptr, indices = csr_from_edges(src, dst, n)
    g = Graph(indptr, indices, x=x, y=y, train_mask=train_mask, val_mask=val_mask,
              test_mask=test_mask, user_ids=user_ids, name=name)
    _check_indptr(indptr, len(indices), source)  # the ids were checked above: only the node data is left
    g = dataclasses.replace(g, **validate_node_data(g, n, source))
    return g.to_undirected() if to_undirected else g
