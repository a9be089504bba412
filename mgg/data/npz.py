"""``.npz`` graph files: read (edge_index or CSR layout) and atomic write."""
from __future__ import annotations

import logging
import os
import time
import zipfile
import zlib

import numpy as np

from ..atomic import atomic_write
from ._build import graph_from_edges, infer_num_nodes
from .graph import Graph
from .npzmap import mmap_members
from .rows import read_rows
from .validate import GraphFormatError, validate_graph, validate_mapped

__all__ = ["load_npz", "save_npz"]

_NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask", "user_ids")

log = logging.getLogger("mgg.data")

#: an edge_index load slower than this logs how to convert the file once
CONVERT_HINT_SECONDS = 2.0


def load_npz(path: str | os.PathLike, num_nodes: int | None = None, name: str | None = None,
             to_undirected: bool = False, mmap: bool = False) -> Graph:
    """Load a graph from an ``.npz`` archive.

    With ``mmap=True`` a CSR archive (``indptr`` + ``indices``, as `save_npz` writes) is returned
    as a memory-mapped graph (``Graph.mapped``): ``indptr`` is read whole, ``indices``, ``x``,
    ``y`` and the masks stay ``np.memmap`` views of the file (mgg.data.npzmap), and only cheap
    invariants are validated (`validate_mapped`); the index range and node data are checked per
    rank on the rows each rank reads. Members stored compressed are read whole (re-save the
    file with ``save_npz(g, path)`` to map them); an ``edge_index`` archive, ``to_undirected``
    or non-int64 ``indices`` fall back to the in-memory load.

    Structure keys (one of):
        * ``edge_index``: int [2, E], row 0 sources, row 1 targets (PyG convention);
        * ``indptr`` int [N+1] + ``indices`` int [E]: target-major CSR (mgg convention).
    Optional keys: ``x`` float [N, F], ``y`` int [N] (-1 = unlabelled), ``train_mask``,
    ``val_mask``, ``test_mask`` bool [N], ``user_ids`` int64 [N] (the input's id of every node
    of a relabelled file, see ``Graph.user_ids``), ``num_nodes`` int scalar (overridden by the
    ``num_nodes`` argument). Pickled objects are refused.

    Raises:
        GraphFormatError: naming ``path`` and the field (``file`` for a truncated/corrupt
        archive).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GraphFormatError(path, "file", "file not found")
    if not zipfile.is_zipfile(path):
        raise GraphFormatError(path, "file", "not a .npz (zip) archive, or truncated: no valid zip directory")
    if mmap and not to_undirected:
        g = _load_mapped(path, num_nodes, name)
        if g is not None:
            return g
    if _holds(path, "edge_index"):
        return _load_edge_index(path, num_nodes, name, to_undirected)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError) as e:
        # NotImplementedError/RuntimeError: zipfile on a damaged member header (unknown compression
        # method, "encrypted" flag bit)
        raise GraphFormatError(path, "file", f"not a readable .npz archive (truncated or corrupt?): {e}") from e
    except ValueError as e:  # e.g. an object array needing pickle, or a damaged member header
        raise GraphFormatError(path, "file", f"cannot read archive member: {e}") from e
    node = {k: arrays.get(k) for k in _NODE_KEYS}
    n_arg = num_nodes if num_nodes is not None else arrays.get("num_nodes")
    label = name or os.path.basename(path)
    if "indptr" in arrays and "indices" in arrays:
        g = Graph(arrays["indptr"], arrays["indices"], name=label, **node)
        if n_arg is not None:
            n = infer_num_nodes(n_arg, None, None, source=path)
            if np.ndim(arrays["indptr"]) == 1 and n != len(arrays["indptr"]) - 1:  # else validate_graph names it
                raise GraphFormatError(path, "indptr", f"indptr has {len(arrays['indptr'])} entries but num_nodes={n}")
        g = validate_graph(g, path)
        return g.to_undirected() if to_undirected else g
    missing = "edge_index" if "indptr" not in arrays and "indices" not in arrays else (
        "indices" if "indptr" in arrays else "indptr")
    raise GraphFormatError(path, missing, f"missing; the archive needs 'edge_index' or 'indptr'+'indices' (found keys {sorted(arrays)})")


def _holds(path: str, key: str) -> bool:
    """Whether the zip archive at `path` has the member ``key.npy`` (False when unreadable: the
    full load then names the damage)."""
    try:
        with zipfile.ZipFile(path) as z:
            return key + ".npy" in z.namelist()
    except Exception:  # noqa: BLE001 - BadZipFile, OSError, struct errors of a damaged archive
        return False


def _load_edge_index(path: str, num_nodes: int | None, name: str | None, to_undirected: bool) -> Graph:
    """An ``edge_index`` archive: the edge list is memory-mapped where stored uncompressed (no
    copy, no CRC pass) and sorted into CSR (mgg.data.edge_sort); node data is read whole. Logs
    the rate and how to convert the file once (`python -m mgg.prepare`) on the ``mgg.data``
    logger when the sort took long."""
    t0 = time.perf_counter()
    arrays = mmap_members(path)
    ei = arrays["edge_index"]
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphFormatError(path, "edge_index", f"must have shape [2, E], got {ei.shape}")
    node = {k: _in_memory(arrays.get(k)) for k in _NODE_KEYS}
    n_arg = num_nodes if num_nodes is not None else arrays.get("num_nodes")
    g = graph_from_edges(ei[0], ei[1], source=path, name=name or os.path.basename(path), num_nodes=n_arg,
                         to_undirected=to_undirected, **node)
    dt = time.perf_counter() - t0
    if dt >= CONVERT_HINT_SECONDS:
        log.info("%s: sorted %s edges into CSR in %.1f s (%.0fM edges/s); convert it once with "
                 "`python -m mgg.prepare %s --out GRAPH.npz%s` and train on GRAPH.npz, which loads "
                 "memory-mapped without sorting", path, f"{g.num_edges:,}", dt, g.num_edges / dt / 1e6, path,
                 " --undirected" if to_undirected else "")
    return g


def _in_memory(a: np.ndarray | None) -> np.ndarray | None:
    """A mapped member read into memory (positioned reads for a map; scalars copied)."""
    if isinstance(a, np.memmap) and a.ndim >= 1:
        return read_rows(a, 0, a.shape[0])
    return None if a is None else np.array(a)


def _load_mapped(path: str, num_nodes: int | None, name: str | None) -> Graph | None:
    """The memory-mapped graph of a CSR archive, or None when the archive needs the full load
    (edge_index layout, non-int64 indices)."""
    arrays = mmap_members(path)
    if "indptr" not in arrays or "indices" not in arrays or arrays["indices"].dtype != np.int64:
        return None
    indptr = np.array(arrays["indptr"])  # read whole: N + 1 entries
    n_arg = num_nodes if num_nodes is not None else arrays.get("num_nodes")
    if n_arg is not None:
        n = infer_num_nodes(n_arg, None, None, source=path)
        if indptr.ndim == 1 and n != len(indptr) - 1:
            raise GraphFormatError(path, "indptr", f"indptr has {len(indptr)} entries but num_nodes={n}")
    node = {k: arrays.get(k) for k in _NODE_KEYS}
    g = Graph(indptr, arrays["indices"], name=name or os.path.basename(path), mapped=True, **node)
    return validate_mapped(g, path)


def save_npz(graph: Graph, path: str | os.PathLike, compressed: bool = False) -> None:
    """Write ``graph`` as CSR (``indptr``, ``indices`` + present node data + ``num_nodes``)
    atomically (temp file + ``os.replace``). The graph is validated first."""
    g = validate_graph(graph, str(path))
    arrays = {"indptr": g.indptr, "indices": g.indices, "num_nodes": np.int64(g.num_nodes)}
    for k in _NODE_KEYS:
        v = getattr(g, k)
        if v is not None:
            arrays[k] = v
    saver = np.savez_compressed if compressed else np.savez
    atomic_write(path, lambda f: saver(f, **arrays))
