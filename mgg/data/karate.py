"""The embedded default dataset: Zachary's karate club (shipped by ``networkx``).

No downloadable-free Cora copy exists on PyPI in an installable package (see
docs/datasets.md), so mgg's offline default is the real, labelled karate-club graph from
``networkx.karate_club_graph()``: 34 nodes, 78 undirected edges (156 directed CSR entries),
2 classes (0 = 'Mr. Hi', 1 = 'Officer'), features = identity float32 [34, 34].
"""
from __future__ import annotations

import numpy as np

from ._build import graph_from_edges
from .graph import Graph

__all__ = ["load_karate", "KARATE_CLASSES"]

KARATE_CLASSES = ("Mr. Hi", "Officer")


def load_karate(train_per_class: int = 4, num_val: int = 10, seed: int = 0) -> Graph:
    """Zachary's karate club as an undirected Graph (both directions stored, rows sorted).

    Split (deterministic per ``seed``): ``train_per_class`` nodes of each class for training,
    ``num_val`` of the rest for validation, all remaining nodes for test (default 8/10/16).
    """
    import networkx as nx  # networkx ships the data in its own source (no file, no network)

    G = nx.karate_club_graph()
    n = G.number_of_nodes()
    nodes = sorted(G.nodes())
    assert nodes == list(range(n))
    y = np.array([KARATE_CLASSES.index(G.nodes[v]["club"]) for v in nodes], dtype=np.int64)
    e = np.array(sorted(G.edges()), dtype=np.int64).reshape(-1, 2)
    rng = np.random.default_rng(seed)
    train = np.zeros(n, dtype=bool)
    for c in range(len(KARATE_CLASSES)):
        ids = np.flatnonzero(y == c)
        train[rng.choice(ids, size=min(train_per_class, len(ids)), replace=False)] = True
    rest = rng.permutation(np.flatnonzero(~train))
    val = np.zeros(n, dtype=bool)
    val[rest[:num_val]] = True
    test = ~(train | val)
    return graph_from_edges(e[:, 0], e[:, 1], source="<networkx karate_club_graph>", name="karate",
                            num_nodes=n, x=np.eye(n, dtype=np.float32), y=y, train_mask=train,
                            val_mask=val, test_mask=test, to_undirected=True)
