"""Plain edge-list text files (``.txt``, ``.edges``, ``.el``, ``.csv``; optionally ``.gz``)."""
from __future__ import annotations

import io
import os

import numpy as np

from ._build import graph_from_edges
from ._text import read_table
from .graph import Graph
from .npz import atomic_write
from .validate import validate_graph

__all__ = ["load_edgelist", "save_edgelist", "EDGELIST_SUFFIXES"]

EDGELIST_SUFFIXES = (".txt", ".edges", ".el", ".csv")


def load_edgelist(path: str | os.PathLike, num_nodes: int | None = None, name: str | None = None,
                  to_undirected: bool = False) -> Graph:
    """Load ``src dst`` pairs, one edge ``src -> dst`` per line.

    Columns are separated by whitespace or by commas (decided on the first data line); lines
    starting with ``#`` or ``%`` and blank lines are skipped; exactly two integer columns.
    ``num_nodes`` defaults to ``max(id) + 1``. No features or labels.

    Raises:
        GraphFormatError: file path + field ``edges`` (line number for a bad token/column count)
        or ``indices`` (id out of range for ``num_nodes``).
    """
    path = os.fspath(path)
    t = read_table(path, "edges", np.int64, ncols=2, allow_empty=num_nodes is not None)
    return graph_from_edges(t[:, 0], t[:, 1], source=path, name=name or os.path.basename(path),
                            num_nodes=num_nodes, field="edges", to_undirected=to_undirected)


def save_edgelist(graph: Graph, path: str | os.PathLike) -> None:
    """Write ``src dst`` lines (CSR order) atomically, with a ``# nodes N edges E`` header."""
    g = validate_graph(graph, str(path))
    ei = g.edge_index().T

    def write(f):
        f.write(f"# nodes {g.num_nodes} edges {g.num_edges}\n".encode())
        buf = io.StringIO()
        np.savetxt(buf, ei, fmt="%d")
        f.write(buf.getvalue().encode())

    atomic_write(path, write)
