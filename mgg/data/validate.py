"""Validation of a :class:`~mgg.data.graph.Graph`: dtypes, CSR invariants, id ranges, node data.

Every check is vectorised (a few passes over each array; features are scanned in row chunks
to bound temporary memory), so graphs with 10^8 edges validate in seconds.
"""
from __future__ import annotations

import dataclasses

import os

import numpy as np

from .graph import Graph

__all__ = ["GraphFormatError", "validate_graph", "validate_node_data", "validate_mapped", "check_index_share", "validate_rows"]

_X_CHUNK_ROWS = 1 << 16
_MASKS = ("train_mask", "val_mask", "test_mask")


class GraphFormatError(ValueError):
    """A graph source is malformed.

    The message reads ``"<source>: <field>: <problem>"``, e.g.
    ``"data/g.npz: indices: indices[17]=-3 is negative"``.

    Attributes:
        source: file path, or ``"<generator sbm>"`` etc.
        field: the offending field (``indptr``, ``indices``, ``x``, ``y``, ``train_mask``, ...,
            or ``file`` for unreadable input).
        problem: what is wrong.
    """

    def __init__(self, source: str, field: str, problem: str):
        self.source = str(source)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.source}: {field}: {problem}")


def _as_int64(a, source: str, field: str) -> np.ndarray:
    """Lossless conversion of an index array to int64, else GraphFormatError."""
    a = np.asarray(a)
    if a.dtype == np.int64:
        return a
    if a.dtype.kind in "iu":
        if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and a.max() > np.iinfo(np.int64).max:
            raise GraphFormatError(source, field, f"uint64 values above int64 range")
        return a.astype(np.int64)
    raise GraphFormatError(source, field, f"dtype {a.dtype} is not an integer type (expected int64)")


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _check_ids(ids: np.ndarray, n: int, source: str, field: str, offset: int = 0) -> None:
    """0 <= ids < n; `offset`: position of ids[0] in the field (for the message)."""
    if ids.size == 0:
        return
    from .edge_sort import id_range

    lo, hi = id_range(ids)
    if lo < 0:
        k = _first(ids < 0)
        raise GraphFormatError(source, field, f"{field}[{k + offset}]={int(ids[k])} is negative")
    if hi >= n:
        k = _first(ids >= n)
        raise GraphFormatError(source, field, f"{field}[{k + offset}]={int(ids[k])} is out of range for {n} nodes (must be < {n})")


def _check_x(x, n: int, source: str, row0: int = 0) -> np.ndarray:
    """`row0`: global row of x[0] (x may be a block of rows; messages name global rows)."""
    x = np.asarray(x)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    if x.ndim != 2:
        raise GraphFormatError(source, "x", f"must be 2-D [N, F], got shape {x.shape}")
    if x.shape[0] != n:
        raise GraphFormatError(source, "x", f"indptr has {n + 1} entries ({n} nodes) but x has {x.shape[0]} rows")
    s0 = row0
    kind = x.dtype.kind
    if kind == "f":
        if x.dtype != np.float32:
            if x.dtype.itemsize > 4:
                for s in range(0, n, _X_CHUNK_ROWS):
                    blk = x[s:s + _X_CHUNK_ROWS]
                    big = np.isfinite(blk) & (np.abs(blk) > np.finfo(np.float32).max)
                    if big.any():
                        r = s0 + s + int(np.argmax(big.any(axis=1)))
                        raise GraphFormatError(source, "x", f"x row {r} has a value beyond float32 range")
            x = x.astype(np.float32)
    elif kind in "iub":
        if kind != "b" and x.size and max(abs(int(x.min())), abs(int(x.max()))) > 2 ** 24:
            raise GraphFormatError(source, "x", f"integer features of dtype {x.dtype} exceed 2**24 and cannot convert losslessly to float32")
        x = x.astype(np.float32)
    else:
        raise GraphFormatError(source, "x", f"dtype {x.dtype} is not numeric (expected float32)")
    r = _first_nonfinite_row(x)
    if r is not None:
        what = "NaN" if np.isnan(x[r]).any() else "inf"
        raise GraphFormatError(source, "x", f"x contains {what} at row {r + s0}")
    return x


def _first_nonfinite_row(x: np.ndarray) -> int | None:
    """The first row of the float 2-D `x` holding a NaN or an inf, or None. Blocks of
    _X_CHUNK_ROWS rows are checked on a thread pool (numpy releases the GIL in isfinite)."""
    n = x.shape[0]
    starts = list(range(0, n, _X_CHUNK_ROWS))

    def first_bad(s: int) -> int | None:
        ok = np.isfinite(x[s:s + _X_CHUNK_ROWS]).all(axis=1)
        return None if ok.all() else s + int(np.argmin(ok))

    threads = min(len(starts), os.cpu_count() or 1, 16)
    if threads <= 1:
        found = map(first_bad, starts)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            found = list(pool.map(first_bad, starts))
    return next((r for r in found if r is not None), None)


def _check_y(y, n: int, source: str, row0: int = 0) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise GraphFormatError(source, "y", f"must be 1-D [N], got shape {y.shape}")
    if y.shape[0] != n:
        raise GraphFormatError(source, "y", f"y has {y.shape[0]} entries but the graph has {n} nodes")
    y = _as_int64(y, source, "y")
    if y.size and int(y.min()) < -1:
        k = _first(y < -1)
        raise GraphFormatError(source, "y", f"y[{k + row0}]={int(y[k])} is below -1 (-1 marks unlabelled)")
    return y


def _check_mask(m, n: int, source: str, field: str, y: np.ndarray | None, row0: int = 0) -> np.ndarray:
    m = np.asarray(m)
    if m.ndim != 1 or m.shape[0] != n:
        raise GraphFormatError(source, field, f"{field} has shape {m.shape} but the graph has {n} nodes (expected [{n}])")
    if m.dtype != np.bool_:
        if m.dtype.kind in "iu" and (m.size == 0 or (int(m.min()) >= 0 and int(m.max()) <= 1)):
            m = m.astype(bool)
        else:
            raise GraphFormatError(source, field, f"dtype {m.dtype} is not bool (integer 0/1 masks are accepted)")
    if y is not None and m.any():
        bad = m & (y < 0)
        if bad.any():
            k = _first(bad)
            raise GraphFormatError(source, field, f"{field} selects node {k + row0}, which is unlabelled (y=-1)")
    return m


def validate_graph(g: Graph, source: str | None = None) -> Graph:
    """Check ``g`` and return a graph with canonical dtypes.

    Lossless conversions are applied (int32/uint -> int64 ids, float64/int -> float32 features,
    0/1 integer masks -> bool); anything else raises :class:`GraphFormatError` naming
    ``source`` (default ``g.name``), the field and the problem.

    Checks: N >= 1; indptr 1-D integer, ``indptr[0] == 0``, non-decreasing,
    ``indptr[-1] == len(indices)``; ``0 <= indices < N``; x is [N, F] and finite; y is [N] with
    values >= -1; masks are bool [N] and select only labelled nodes.
    """
    source = g.name if source is None else str(source)
    if g.indptr is None:
        raise GraphFormatError(source, "indptr", "missing")
    if g.indices is None:
        raise GraphFormatError(source, "indices", "missing")
    indptr = _as_int64(g.indptr, source, "indptr")
    indices = _as_int64(g.indices, source, "indices")
    if indices.ndim != 1:
        raise GraphFormatError(source, "indices", f"must be 1-D, got shape {indices.shape}")
    n = _check_indptr(indptr, len(indices), source)
    _check_ids(indices, n, source, "indices")
    return dataclasses.replace(g, indptr=indptr, indices=indices, **validate_node_data(g, n, source))


def validate_node_data(g: Graph, n: int, source: str) -> dict:
    """x, y and the masks of `g` checked for `n` nodes as `validate_graph` checks them, in
    canonical dtypes (no copy where the dtype already is): {"x", "y", "train_mask", ...}."""
    x = None if g.x is None else _check_x(g.x, n, source)
    y = None if g.y is None else _check_y(g.y, n, source)
    masks = {f: (None if getattr(g, f) is None else _check_mask(getattr(g, f), n, source, f, y)) for f in _MASKS}
    user_ids = None if g.user_ids is None else check_user_ids(g.user_ids, n, source)
    return {"x": x, "y": y, "user_ids": user_ids, **masks}


def check_user_ids(user_ids, n: int, source: str) -> np.ndarray:
    """``Graph.user_ids`` as int64 [N], checked to be a permutation of [0, N) (a relabelled
    file whose map back to the user's ids is damaged is refused, never used)."""
    a = np.asarray(user_ids)
    if a.ndim != 1 or a.shape[0] != n:
        raise GraphFormatError(source, "user_ids", f"has shape {a.shape} but the graph has {n} nodes (expected [{n}])")
    a = _as_int64(a, source, "user_ids")
    seen = np.zeros(n, dtype=bool)
    if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
        raise GraphFormatError(source, "user_ids", f"ids must lie in [0, {n}); found {int(a.min())}..{int(a.max())}")
    seen[a] = True
    if not seen.all():
        raise GraphFormatError(source, "user_ids", f"is not a permutation of [0, {n}): user id {_first(~seen)} "
                                                   f"belongs to no node")
    return a


def _check_indptr(indptr: np.ndarray, num_indices: int, source: str) -> int:
    """CSR row-pointer invariants; returns N."""
    if indptr.ndim != 1:
        raise GraphFormatError(source, "indptr", f"must be 1-D, got shape {indptr.shape}")
    n = len(indptr) - 1
    if n <= 0:
        raise GraphFormatError(source, "indptr", f"empty graph: indptr has {len(indptr)} entries (0 nodes)")
    if indptr[0] != 0:
        raise GraphFormatError(source, "indptr", f"indptr[0]={int(indptr[0])}, expected 0")
    dec = np.diff(indptr) < 0
    if dec.any():
        k = _first(dec) + 1
        raise GraphFormatError(source, "indptr", f"indptr not monotone at position {k} ({int(indptr[k - 1])} > {int(indptr[k])})")
    if indptr[-1] != num_indices:
        raise GraphFormatError(source, "indptr", f"indptr[-1]={int(indptr[-1])} but indices has {num_indices} entries")
    return n


def validate_mapped(g: Graph, source: str | None = None) -> Graph:
    """The checks of `validate_graph` that read no more than ``indptr`` and ``user_ids`` (for a
    memory-mapped graph, ``g.mapped``): indptr invariants, ``indptr[-1] == len(indices)``, the
    shapes and dtypes of indices, x, y and the masks, and that ``user_ids`` is a permutation. The values of ``indices`` are checked per rank by
    `check_index_share`, the node data's by `validate_rows` (every row is checked by the rank
    that reads it). Returns ``g`` with ``indptr`` as int64."""
    source = g.name if source is None else str(source)
    indptr = _as_int64(g.indptr, source, "indptr")
    indices = g.indices
    if indices.ndim != 1:
        raise GraphFormatError(source, "indices", f"must be 1-D, got shape {indices.shape}")
    if indices.dtype != np.int64:
        raise GraphFormatError(source, "indices", f"dtype {indices.dtype}: a memory-mapped graph needs int64 indices")
    n = _check_indptr(indptr, len(indices), source)
    if g.x is not None:
        x = g.x
        if x.ndim not in (1, 2):
            raise GraphFormatError(source, "x", f"must be 2-D [N, F], got shape {x.shape}")
        if x.shape[0] != n:
            raise GraphFormatError(source, "x", f"indptr has {n + 1} entries ({n} nodes) but x has {x.shape[0]} rows")
        if x.dtype.kind not in "fiub":
            raise GraphFormatError(source, "x", f"dtype {x.dtype} is not numeric (expected float32)")
    if g.y is not None:
        y = g.y
        if not (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)):
            raise GraphFormatError(source, "y", f"must be 1-D [N], got shape {y.shape}")
        if y.shape[0] != n:
            raise GraphFormatError(source, "y", f"y has {y.shape[0]} entries but the graph has {n} nodes")
        if y.dtype.kind not in "iu":
            raise GraphFormatError(source, "y", f"dtype {y.dtype} is not an integer type (expected int64)")
    for f in _MASKS:
        m = getattr(g, f)
        if m is None:
            continue
        if m.ndim != 1 or m.shape[0] != n:
            raise GraphFormatError(source, f, f"{f} has shape {m.shape} but the graph has {n} nodes (expected [{n}])")
        if m.dtype != np.bool_ and m.dtype.kind not in "iu":
            raise GraphFormatError(source, f, f"dtype {m.dtype} is not bool (integer 0/1 masks are accepted)")
    if g.user_ids is not None:  # read once (N ids, like indptr), kept mapped
        check_user_ids(np.asarray(g.user_ids), n, source)
    return dataclasses.replace(g, indptr=indptr)


def check_index_share(g: Graph, part: int, parts: int, source: str | None = None) -> None:
    """Range check of share `part` of `parts` of ``indices`` (entries [E*part/parts,
    E*(part+1)/parts)): with every part checked by one rank, every index is checked once, and
    only 1/parts of a memory-mapped ``indices`` is read here."""
    source = g.name if source is None else str(source)
    e = len(g.indices)
    a, b = e * part // parts, e * (part + 1) // parts
    from .rows import read_rows

    _check_ids(read_rows(g.indices, a, b), len(g.indptr) - 1, source, "indices", offset=a)


def validate_rows(g: Graph, lo: int, hi: int, source: str | None = None) -> dict:
    """Rows [lo, hi) of the node data of `g`, checked as `validate_graph` checks the whole arrays
    and converted to canonical dtypes: {"x", "y", "train_mask", "val_mask", "test_mask"} (None
    where absent). Reads only those rows of a memory-mapped graph; messages name global rows."""
    from .rows import read_rows

    source = g.name if source is None else str(source)
    n = hi - lo
    x = None if g.x is None else _check_x(read_rows(g.x, lo, hi), n, source, row0=lo)
    y = None if g.y is None else _check_y(read_rows(g.y, lo, hi), n, source, row0=lo)
    out = {"x": x, "y": y}
    for f in _MASKS:
        m = getattr(g, f)
        out[f] = None if m is None else _check_mask(read_rows(m, lo, hi), n, source, f, y, row0=lo)
    return out
