"""OGB node-property-prediction raw folders (the ``ogbn-*`` on-disk layouts), read offline.

Layout under ``root``, text form (ogbn-arxiv, ogbn-products, ...)::

    raw/edge.csv[.gz]            one "src,dst" per line (edge src -> dst)
    raw/num-node-list.csv[.gz]   optional, one integer N
    raw/node-feat.csv[.gz]       optional, N lines of F comma-separated floats
    raw/node-label.csv[.gz]      optional, N lines of one label (NaN/empty -> -1, unlabelled)
    split/<scheme>/train.csv[.gz], valid.csv[.gz], test.csv[.gz]   optional node-id lists

binary form (ogbn-papers100M's ``papers100M-bin``)::

    raw/data.npz                 edge_index int [2, E], num_nodes_list int [1], num_edges_list
                                 int [1], optional node_feat float [N, F] (other keys ignored)
    raw/node-label.npz           optional, node_label float [N, 1] (NaN -> -1, unlabelled)
    split/<scheme>/...           as above

``data.npz`` members stored uncompressed are memory-mapped (mgg.data.npzmap) and the edges
sorted into CSR share by share (mgg.data.edge_sort); compressed members are read whole.

ogbn graphs are stored *directed* (e.g. ogbn-arxiv, ogbn-papers100M citations); the usual
GNN setup symmetrises them: pass ``to_undirected=True`` (union of both directions,
duplicates removed; ``mgg.train --undirected``).
"""
from __future__ import annotations

import os

import numpy as np

from ._build import graph_from_edges
from ._text import read_table
from .edge_sort import id_range
from .graph import Graph
from .npzmap import mmap_members
from .rows import read_rows
from .validate import GraphFormatError, _check_x

__all__ = ["load_ogb", "is_ogb_folder"]


def _find(d: str, stem: str) -> str | None:
    for suffix in (".csv.gz", ".csv"):
        p = os.path.join(d, stem + suffix)
        if os.path.isfile(p):
            return p
    return None


def _binary(raw: str) -> str | None:
    p = os.path.join(raw, "data.npz")
    return p if os.path.isfile(p) else None


def is_ogb_folder(path: str | os.PathLike) -> bool:
    """True if ``path`` is a folder holding ``raw/edge.csv[.gz]`` or ``raw/data.npz``."""
    path = os.fspath(path)
    raw = os.path.join(path, "raw")
    return os.path.isdir(path) and (_find(raw, "edge") is not None or _binary(raw) is not None)


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
    """Load an ogbn-style folder, text or binary form (see the module docstring for the layouts).

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
    if _find(raw, "edge") is not None:
        src, dst, n, x, y, edge_path = _read_text_raw(raw)
    elif _binary(raw) is not None:
        src, dst, n, x, y, edge_path = _read_binary_raw(raw)
    else:
        raise GraphFormatError(root, "edges", "no raw/edge.csv[.gz] or raw/data.npz (not an ogbn-style folder)")
    masks = _read_split(root, split, n)
    return graph_from_edges(src, dst, source=edge_path, name=name or os.path.basename(os.path.normpath(root)),
                            num_nodes=n, field="edges", x=x, y=y, to_undirected=to_undirected, **masks)


def _labels(t: np.ndarray, path: str) -> np.ndarray:
    """int64 [N] labels from float labels (NaN -> -1); GraphFormatError on a fraction."""
    t = np.asarray(t, dtype=np.float64)
    lab = ~np.isnan(t)
    if (t[lab] != np.round(t[lab])).any():
        k = int(np.argmax(lab & (t != np.round(np.nan_to_num(t)))))
        raise GraphFormatError(path, "y", f"label on data row {k} is not an integer: {t[k]}")
    return np.where(lab, t, -1).astype(np.int64)


def _read_text_raw(raw: str):
    """(src, dst, N or None, x, y, edge file) of the csv form."""
    edge_path = _find(raw, "edge")
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
        y = _labels(read_table(p, "y", np.float64, ncols=1)[:, 0], p)
        if n is not None and y.shape[0] != n:
            raise GraphFormatError(p, "y", f"graph has {n} nodes but y has {y.shape[0]} entries")
        n = y.shape[0] if n is None else n
    if n is None:
        n = int(e.max()) + 1 if e.size else 0
    return e[:, 0], e[:, 1], n, x, y, edge_path


def _one_count(arrays: dict, path: str, key: str) -> int | None:
    if key not in arrays:
        return None
    v = np.asarray(arrays[key]).reshape(-1)
    if v.size != 1 or v.dtype.kind not in "iu":
        raise GraphFormatError(path, key, f"expected one graph's count (one integer), got shape {v.shape} {v.dtype}")
    return int(v[0])


def _read_binary_raw(raw: str):
    """(src, dst, N, x, y, data.npz path) of the binary form."""
    path = _binary(raw)
    arrays = mmap_members(path)
    if "edge_index" not in arrays:
        raise GraphFormatError(path, "edge_index", f"missing (found keys {sorted(arrays)})")
    ei = arrays["edge_index"]
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphFormatError(path, "edge_index", f"must have shape [2, E], got {ei.shape}")
    n = _one_count(arrays, path, "num_nodes_list")
    e = _one_count(arrays, path, "num_edges_list")
    if e is not None and e != ei.shape[1]:
        raise GraphFormatError(path, "num_edges_list", f"says {e} edges but edge_index has {ei.shape[1]}")
    x = None
    if "node_feat" in arrays:
        x = arrays["node_feat"]
        x = read_rows(x, 0, x.shape[0]) if isinstance(x, np.memmap) and x.ndim >= 1 else np.asarray(x)
        n = x.shape[0] if n is None else n
        if x.ndim >= 1 and x.shape[0] != n:
            raise GraphFormatError(path, "x", f"num_nodes_list says {n} nodes but node_feat has {x.shape[0]} rows")
    y = None
    label_path = os.path.join(raw, "node-label.npz")
    if os.path.isfile(label_path):
        labels = mmap_members(label_path)
        if "node_label" not in labels:
            raise GraphFormatError(label_path, "y", f"no node_label array (found keys {sorted(labels)})")
        t = np.asarray(labels["node_label"])
        if t.ndim == 2 and t.shape[1] == 1:
            t = t[:, 0]
        if t.ndim != 1:
            raise GraphFormatError(label_path, "y", f"node_label must be [N] or [N, 1], got shape {t.shape}")
        y = _labels(t, label_path)
        n = y.shape[0] if n is None else n
        if y.shape[0] != n:
            raise GraphFormatError(label_path, "y", f"graph has {n} nodes but node_label has {y.shape[0]} entries")
    if n is None:
        n = (max(id_range(ei[0])[1], id_range(ei[1])[1]) + 1) if ei.shape[1] else 0
    return ei[0], ei[1], n, x, y, path


def _read_split(root: str, split: str | None, n: int) -> dict:
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
    return masks
