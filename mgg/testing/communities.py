"""A graph of planted communities behind shuffled ids: what a locality-preserving node order
must find (tests of mgg.data.reorder and of training in another order)."""
from __future__ import annotations

import numpy as np

from ..data.graph import Graph

__all__ = ["shuffled_communities"]


def shuffled_communities(k: int = 8, size: int = 200, degree: int = 12, cross: float = 0.0, seed: int = 0,
                         features: bool = True) -> tuple[Graph, np.ndarray]:
    """(graph, community of every node, int64 [N]): `k` communities of `size` nodes; every node has
    `degree` in-edges, from its own community except a share `cross` from anywhere; ids randomly
    shuffled. y = the community, x float32 [N, 6] standard normal (with `features`), no masks."""
    rng = np.random.default_rng(seed)
    n = k * size
    comm = np.repeat(np.arange(k), size)
    tgt = np.repeat(np.arange(n), degree)
    src = comm[tgt] * size + rng.integers(0, size, len(tgt))
    far = rng.random(len(tgt)) < cross
    src[far] = rng.integers(0, n, int(far.sum()))
    shuffle = rng.permutation(n)  # planted id -> shuffled id
    s, t = shuffle[src], shuffle[tgt]
    order = np.lexsort((s, t))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(t, minlength=n), out=indptr[1:])
    label = np.empty(n, dtype=np.int64)
    label[shuffle] = comm
    x = rng.standard_normal((n, 6)).astype(np.float32) if features else None
    return Graph(indptr, s[order].astype(np.int64), x=x, y=label, name="communities"), label
