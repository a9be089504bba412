"""METIS node order: nodes laid out part after part of a METIS recursive bisection.

The order serves every P at once: METIS's recursive bisection numbers its parts along the
bisection tree (parts [0, k/2) are one half, [k/2, k) the other, and so on down), so the
contiguous ranges mgg cuts for P = 2, 4, 8, ... (up to `LEAF_PARTS`) each hold whole subtrees.
Measured on products-like (docs/partition.md): the edge-balanced ranges of this order read as
few distinct remote rows per rank as METIS's own P-way partition, at P = 2, 4 and 8.

METIS sees the symmetrised 0/1 pattern (duplicates merged, self loops dropped) with one vertex
weight per node, ``in-degree + 1`` (the CSR entries the node's rank aggregates, plus the node
itself), so its balanced parts are the edge-balanced ranges mgg's partitioner cuts. Inside a
part nodes keep their input order. The result is deterministic (a fixed METIS seed).

pymetis (PyPI; the ``metis`` extra: ``pip install 'mgg[metis]'``) is optional: without it
`metis_order` raises ValueError naming the install command.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph

__all__ = ["LEAF_PARTS", "have_pymetis", "metis_order", "metis_membership", "metis_host_bytes",
           "MISSING_PYMETIS"]

#: parts of the bisection tree: the order is nested for every P that divides it
LEAF_PARTS = 64
#: METIS's random seed (the order is the same on every run and every rank)
SEED = 0
#: host bytes per symmetrised entry and per node that METIS and the pattern need at their peak
#: (products-like at scale 1: 123M entries, 2.4M nodes, 17.4 GB peak; docs/partition.md)
BYTES_PER_ENTRY = 128
BYTES_PER_NODE = 400

MISSING_PYMETIS = ("--reorder-nodes metis needs the pymetis package (pip install 'mgg[metis]' or "
                   "pip install pymetis); --reorder-nodes cluster needs nothing extra")


def have_pymetis() -> bool:
    """Whether pymetis imports here."""
    try:
        import pymetis  # noqa: F401
    except ImportError:
        return False
    return True


def metis_host_bytes(num_nodes: int, num_edges: int) -> int:
    """Estimated peak host bytes of `metis_order` for a graph of N nodes and E CSR entries
    (the symmetrised pattern holds at most 2E entries)."""
    return BYTES_PER_ENTRY * 2 * int(num_edges) + BYTES_PER_NODE * int(num_nodes)


def _metis_adjacency(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(xadj int64 [N+1], adjncy int64 [M]): the symmetrised 0/1 pattern without self loops."""
    n = graph.num_nodes
    import scipy.sparse as sp  # imported on first use: slow to import

    a = sp.csr_matrix((np.ones(graph.num_edges, dtype=np.int8), np.asarray(graph.indices),
                       np.asarray(graph.indptr)), shape=(n, n))
    a = (a + a.T).tocsr()  # duplicates merged by the sum
    a = (a - sp.diags(a.diagonal(), format="csr", dtype=a.dtype)).tocsr()
    a.eliminate_zeros()
    return a.indptr.astype(np.int64), a.indices.astype(np.int64)


def leaf_parts(num_nodes: int) -> int:
    """Parts of the bisection: `LEAF_PARTS`, fewer (a power of two, at least 8 nodes a part) for
    a small graph; 1 means no bisection."""
    k = LEAF_PARTS
    while k > 1 and num_nodes < 8 * k:
        k //= 2
    return k


def metis_membership(graph: Graph, parts: int | None = None) -> np.ndarray:
    """int64 [N]: the part of every node in METIS's recursive bisection into `parts` parts
    (default `leaf_parts(N)`); all zeros when there is nothing to cut (one part, no edges)."""
    n = graph.num_nodes
    k = leaf_parts(n) if parts is None else int(parts)
    if k < 1:
        raise ValueError(f"metis: parts must be >= 1, got {k}")
    if k == 1 or graph.num_edges == 0:
        return np.zeros(n, dtype=np.int64)
    try:
        import pymetis
    except ImportError:
        raise ValueError(MISSING_PYMETIS) from None
    xadj, adjncy = _metis_adjacency(graph)
    if len(adjncy) == 0:  # only self loops
        return np.zeros(n, dtype=np.int64)
    vweights = np.diff(np.asarray(graph.indptr, dtype=np.int64)) + 1
    res = pymetis.part_graph(k, adjacency=pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights,
                             recursive=True, options=pymetis.Options(seed=SEED))
    return np.asarray(res.vertex_part, dtype=np.int64)


def metis_order(graph: Graph, parts: int | None = None) -> np.ndarray:
    """int64 [N] ``perm`` (``perm[new] = old``): nodes part after part of `metis_membership`,
    input order inside a part. Raises ValueError when pymetis is missing."""
    return np.argsort(metis_membership(graph, parts), kind="stable").astype(np.int64)
