"""``load_dataset``: one entry point for built-in names and files/folders."""
from __future__ import annotations

import difflib
import os

from .generators import PRESETS, preset, sbm
from .graph import Graph
from .formats import FORMATS, expected_formats, format_for
from .loaders import load_karate
from .npz import load_npz
from .validate import GraphFormatError

__all__ = ["load_dataset", "DATASET_NAMES", "DEFAULT_DATASET"]

DEFAULT_DATASET = "karate"
#: Built-in names. ``cora`` is not among them: no PyPI package ships it for offline use.
DATASET_NAMES = ("default", "karate", "sbm", *PRESETS)

_SBM_NODES = 10_000


def load_dataset(name_or_path: str | os.PathLike, scale: float = 1.0, seed: int = 0,
                 device: str | None = None, mmap: bool = True, to_undirected: bool = False) -> Graph:
    """Load a built-in dataset by name, or a graph file/folder by path.

    Names: ``default`` (= ``karate``, the embedded real dataset), ``karate``, ``sbm``
    (``round(10000*scale)`` nodes, degree 10, 7 classes), ``reddit-like``, ``products-like``,
    ``papers-like`` (power-law presets; ``scale`` in (0, 1] shrinks nodes and edges). ``seed``
    seeds generators (and the karate split). ``device`` (None: CPU; e.g. ``"cuda"``) is where the
    power-law presets draw their edges and features (the same graph on any device).

    Paths: any format of `mgg.data.formats.FORMATS` -- built in: a folder with
    ``raw/edge.csv[.gz]`` (ogbn layout), ``*.npz``, or an edge list ``*.txt|*.edges|*.el|*.csv``
    (optionally ``.gz``).

    ``mmap`` (default True): a CSR ``.npz`` is returned memory-mapped (``Graph.mapped``, see
    `mgg.data.npz.load_npz`): only ``indptr`` is read and checked whole; the values of
    ``indices`` and the node data are checked by whoever reads them (the training app: each
    rank its share, `check_index_share` / `validate_rows`; `validate_graph(g)` checks all).
    Every other format and every generated graph is in memory.

    ``to_undirected``: symmetrise the graph (`Graph.to_undirected`: both directions of every
    edge, duplicates removed), e.g. for ogbn-arxiv, stored directed; the graph is then built in
    memory (a CSR file is not mapped).

    Raises:
        ValueError: unknown name (the message lists the valid names) or unsupported path.
        GraphFormatError: malformed file.
    """
    key = os.fspath(name_or_path)
    if not (0 < scale <= 1):
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    low = key.lower()
    if low in ("default", "karate"):
        g = load_karate(seed=seed)
    elif low == "sbm":
        g = sbm(num_nodes=max(7, int(round(_SBM_NODES * scale))), seed=seed)
    elif low in PRESETS:
        g = preset(low, scale=scale, seed=seed, device=device)
    elif os.path.exists(key):
        fmt = format_for(key)
        if fmt is not None and fmt.name == "npz" and mmap and not to_undirected:
            return load_npz(key, mmap=True)
        if fmt is not None:
            return fmt.load(key, to_undirected=True) if to_undirected else fmt.load(key)
        if os.path.isdir(key):
            raise GraphFormatError(key, "file", "folder is not " + " or ".join(
                f.not_this_folder for f in FORMATS if f.folder))
        raise ValueError(f"unsupported file type {key!r}: expected {expected_formats()}")
    else:
        close = difflib.get_close_matches(low, DATASET_NAMES, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown dataset {key!r}{hint}: not a file or folder, and not one of the names "
                         f"{', '.join(DATASET_NAMES)}")
    return g.to_undirected() if to_undirected else g
