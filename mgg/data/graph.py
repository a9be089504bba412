"""The in-memory graph container shared by every mgg layer.

CSR orientation (see docs/architecture.md): row ``i`` lists the *sources* ``j`` of the edges
``j -> i``, i.e. the neighbours whose features node ``i`` aggregates.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np

from .edge_sort import csr_from_checked_edges

__all__ = ["Graph", "csr_from_edges"]

# Number of `indices` entries hashed by Graph.fingerprint (strided sample).
_FINGERPRINT_SAMPLE = 1 << 20


def csr_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Target-major CSR from an edge list, without Python loops (mgg.data.edge_sort: a packed-key
    sort, on several threads for large graphs).

    Args:
        src: int [E] edge sources.
        dst: int [E] edge targets (each edge ``src[k] -> dst[k]`` lands in CSR row ``dst[k]``).
        num_nodes: N; ids must already lie in ``[0, N)``.

    Returns:
        ``(indptr int64 [N+1], indices int64 [E])``. Within a row, edges keep their input order
        (the order of a stable sort), duplicates are kept.
    """
    src, dst = np.asarray(src), np.asarray(dst)
    if src.dtype.kind not in "iu" or dst.dtype.kind not in "iu":  # e.g. an empty list
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    return csr_from_checked_edges(src, dst, num_nodes)


@dataclass
class Graph:
    """A graph in target-major CSR with optional node data.

    Attributes:
        indptr: int64 [N+1]; ``indptr[0] == 0``, non-decreasing, ``indptr[-1] == E``.
        indices: int64 [E]; ``indices[indptr[i]:indptr[i+1]]`` are the sources j of edges j -> i.
        x: float32 [N, F] node features, or None.
        y: int64 [N] node labels (-1 = unlabelled), or None.
        train_mask, val_mask, test_mask: bool [N], or None.
        user_ids: int64 [N] with ``user_ids[k]`` = the id the user's input gave node ``k``, when
            the nodes were relabelled (mgg.data.reorder; stored in the file by
            ``mgg.prepare --reorder-nodes``); None when the graph is in the user's order.
            Per-node results go back to the user's ids with ``out_user[user_ids] = out``.
        name: a human-readable name (dataset name or file path).
        mapped: ``indices`` and the node data are read-only ``np.memmap`` views of a file
            (mgg.data.npz.load_npz with ``mmap=True``): read only the rows you need
            (`indptr` is in memory).
    """

    indptr: np.ndarray
    indices: np.ndarray
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    user_ids: np.ndarray | None = None
    name: str = "graph"
    mapped: bool = False

    # ------------------------------------------------------------------ sizes
    @property
    def num_nodes(self) -> int:
        """N = len(indptr) - 1."""
        return int(len(self.indptr)) - 1

    @property
    def num_edges(self) -> int:
        """E = len(indices) (directed edges, duplicates counted)."""
        return int(len(self.indices))

    @property
    def num_features(self) -> int:
        """F, or 0 without features."""
        return 0 if self.x is None else int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        """max(y) + 1 over labelled nodes (y >= 0), or 0 without labels."""
        if self.y is None or len(self.y) == 0:
            return 0
        m = int(self.y.max())
        return m + 1 if m >= 0 else 0

    # ------------------------------------------------------------- structure
    def in_degree(self) -> np.ndarray:
        """int64 [N]: number of CSR entries of each row (duplicates counted)."""
        return np.diff(self.indptr)

    def out_degree(self) -> np.ndarray:
        """int64 [N]: number of times each node appears as a source."""
        return np.bincount(self.indices, minlength=self.num_nodes).astype(np.int64)

    def targets(self) -> np.ndarray:
        """int64 [E]: the CSR row (target) of every entry of ``indices``."""
        return np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.in_degree())

    def edge_index(self) -> np.ndarray:
        """int64 [2, E]: row 0 = sources, row 1 = targets (PyG convention), in CSR order."""
        return np.stack([np.asarray(self.indices, dtype=np.int64), self.targets()])

    def reverse(self) -> "Graph":
        """The transposed graph (every edge j -> i becomes i -> j); node data is kept (shared).

        ``g.reverse().reverse()`` has the same rows as ``g`` (row contents in ascending
        original-row order, which for a row-sorted input is identical).
        """
        indptr, indices = csr_from_edges(self.targets(), self.indices, self.num_nodes)
        return dataclasses.replace(self, indptr=indptr, indices=indices)

    def sort_rows(self) -> "Graph":
        """Copy with the sources inside every row sorted ascending."""
        key = self.targets() * max(self.num_nodes, 1) + self.indices
        order = np.argsort(key, kind="stable")
        return dataclasses.replace(self, indices=self.indices[order])

    def to_undirected(self) -> "Graph":
        """Symmetrised copy: the union of the edges and their reverses, duplicates removed,
        rows sorted. Self loops are kept once."""
        n = self.num_nodes
        t = self.targets()
        src = np.concatenate([self.indices, t])
        dst = np.concatenate([t, self.indices])
        key = np.unique(dst * max(n, 1) + src)  # sorted by (target, source): already CSR order
        if n == 0:
            return dataclasses.replace(self, indptr=np.zeros(1, np.int64), indices=key)
        dst_u, src_u = np.divmod(key, n)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst_u, minlength=n), out=indptr[1:])
        return dataclasses.replace(self, indptr=indptr, indices=src_u)

    def fingerprint(self) -> str:
        """Stable hex digest (blake2b, 16 bytes) of the structure and sizes.

        Hashes N, E, F, num_classes, the full ``indptr`` and a strided sample of at most
        2**20 entries of ``indices`` (stride ``ceil(E / 2**20)``), so it is cheap even for
        billions of edges. Two graphs that differ only in unsampled ``indices`` entries (same
        degrees) collide; features and masks are not hashed beyond their sizes.
        """
        h = hashlib.blake2b(digest_size=16)
        sizes = np.array([self.num_nodes, self.num_edges, self.num_features, self.num_classes],
                         dtype=np.int64)
        h.update(sizes.tobytes())
        h.update(np.ascontiguousarray(self.indptr, dtype=np.int64).tobytes())
        stride = max(1, -(-self.num_edges // _FINGERPRINT_SAMPLE))
        h.update(np.ascontiguousarray(self.indices[::stride], dtype=np.int64).tobytes())
        return h.hexdigest()

    def __repr__(self) -> str:  # keep arrays out of the repr
        return (f"Graph(name={self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"num_features={self.num_features}, num_classes={self.num_classes})")
