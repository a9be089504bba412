"""OGB node-property-prediction raw folders (the ``ogbn-*`` on-disk layout), read offline.

Layout under ``root``::

    raw/edge.csv[.gz]            one "src,dst" per line (edge src -> dst)
    raw/num-node-list.csv[.gz]   optional, one integer N
    raw/node-feat.csv[.gz]       optional, N lines of F comma-separated floats
    raw/node-label.csv[.gz]      optional, N lines of one label (NaN/empty -> -1, unlabelled)
    split/<scheme>/train.csv[.gz], valid.csv[.gz], test.csv[.gz]   optional node-id lists

ogbn graphs are stored *directed* (e.g. ogbn-arxiv, ogbn-papers100M citations); the usual
GNN setup symmetrises them: pass ``to_undirected=True`` (union of both directions,
duplicates removed).
"""
from __future__ import annotations

import os

import numpy as np

from ._build import graph_from_edges
from ._text import read_table
from .graph import Graph
from .validate import GraphFormatError, _check_x

__all__ = ["load_ogb", "is_ogb_folder"]


def _find(d: str, stem: str) -> str | None:
    for suffix in (".csv.gz", ".csv"):
        p = os.path.join(d, stem + suffix)
        if os.path.isfile(p):
            return p
    return None


def is_ogb_folder(path: str | os.PathLike) -> bool:
    """True if ``path`` is a folder holding ``raw/edge.csv[.gz]``."""
    path = os.fspath(path)
    return os.path.isdir(path) and _find(os.path.join(path, "raw"), "edge") is not None


def _mask_from_ids(path: str, field: str, n: int) -> np.ndarray:
    ids = read_table(path, field, np.int64, ncols=1, allow_empty=True)[:, 0]
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        k = int(np.argmax((ids < 0) | (ids >= n)))
        raise GraphFormatError(path, field, f"node id {int(ids[k])} on data row {k} is out of range for {n} nodes")
    m = np.zeros(n, dtype=bool)
    m[ids] = True
    return m


def load_ogb(root: str | os.PathLike, split: str | None = None, to_undirected: bool = False,
             name: str | None = None) -> Graph:
    """Load an ogbn-style folder (see the module docstring for the layout).

    Args:
        root: the dataset folder (the one containing ``raw/``).
        split: name of the ``split/<scheme>`` folder; default: the only one, or the first in
            sorted order when several exist.
        to_undirected: symmetrise the (directed as stored) edges.

    Returns:
        Graph with x float32 [N, F], y int64 [N] (-1 unlabelled) and masks when present.
    """
    root = os.fspath(root)
    raw = os.path.join(root, "raw")
    edge_path = _find(raw, "edge")
    if edge_path is None:
        raise GraphFormatError(root, "edges", "no raw/edge.csv or raw/edge.csv.gz (not an ogbn-style folder)")
    e = read_table(edge_path, "edges", np.int64, ncols=2, allow_empty=True)
    n = None
    p = _find(raw, "num-node-list")
    if p is not None:
        t = read_table(p, "num_nodes", np.int64, ncols=1)
        if t.shape[0] != 1:
            raise GraphFormatError(p, "num_nodes", f"expected one graph, found {t.shape[0]} lines")
        n = int(t[0, 0])
    x = None
    p = _find(raw, "node-feat")
    if p is not None:
        x = read_table(p, "x", np.float32)
        x = _check_x(x, x.shape[0], p)  # NaN/inf reported against node-feat.csv
        if n is not None and x.shape[0] != n:
            raise GraphFormatError(p, "x", f"num-node-list says {n} nodes but x has {x.shape[0]} rows")
        n = x.shape[0] if n is None else n
    y = None
    p = _find(raw, "node-label")
    if p is not None:
        t = read_table(p, "y", np.float64, ncols=1)[:, 0]
        lab = ~np.isnan(t)
        if (t[lab] != np.round(t[lab])).any():
            k = int(np.argmax(lab & (t != np.round(np.nan_to_num(t)))))
            raise GraphFormatError(p, "y", f"label on data row {k} is not an integer: {t[k]}")
        y = np.where(lab, t, -1).astype(np.int64)
        if n is not None and y.shape[0] != n:
            raise GraphFormatError(p, "y", f"graph has {n} nodes but y has {y.shape[0]} entries")
        n = y.shape[0] if n is None else n
    if n is None:
        n = int(e.max()) + 1 if e.size else 0
    masks = {}
    split_root = os.path.join(root, "split")
    if os.path.isdir(split_root):
        schemes = sorted(d for d in os.listdir(split_root) if os.path.isdir(os.path.join(split_root, d)))
        if split is not None and split not in schemes:
            raise GraphFormatError(split_root, "split", f"no split scheme {split!r}; found {schemes}")
        if schemes:
            sd = os.path.join(split_root, split or schemes[0])
            for stem, field in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
                p = _find(sd, stem)
                if p is not None:
                    masks[field] = _mask_from_ids(p, field, n)
    return graph_from_edges(e[:, 0], e[:, 1], source=edge_path, name=name or os.path.basename(os.path.normpath(root)),
                            num_nodes=n, field="edges", x=x, y=y, to_undirected=to_undirected, **masks)
