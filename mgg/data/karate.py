"""The embedded default dataset: Zachary's karate club.

The graph is small enough to ship in this module (no file, no network, no extra package): 34
nodes, 78 undirected edges (156 directed CSR entries), 2 classes (0 = 'Mr. Hi', 1 = 'Officer',
the faction each member joined after the split), features = identity float32 [34, 34]. The edge
list and the factions are those of W. W. Zachary, "An information flow model for conflict and
fission in small groups", Journal of Anthropological Research 33(4), 452-473 (1977), as networkx's
`karate_club_graph()` numbers them (nodes 0..33; tests/data/test_data_loaders.py checks the two agree).
"""
from __future__ import annotations

import numpy as np

from ._build import graph_from_edges
from .graph import Graph

__all__ = ["load_karate", "karate_edges", "karate_labels", "KARATE_CLASSES"]

KARATE_CLASSES = ("Mr. Hi", "Officer")

# node -> its neighbours with a higher id (each undirected edge once)
_KARATE_ADJ: dict[int, tuple[int, ...]] = {
    0: (1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 17, 19, 21, 31),
    1: (2, 3, 7, 13, 17, 19, 21, 30),
    2: (3, 7, 8, 9, 13, 27, 28, 32),
    3: (7, 12, 13),
    4: (6, 10),
    5: (6, 10, 16),
    6: (16,),
    8: (30, 32, 33),
    9: (33,),
    13: (33,),
    14: (32, 33),
    15: (32, 33),
    18: (32, 33),
    19: (33,),
    20: (32, 33),
    22: (32, 33),
    23: (25, 27, 29, 32, 33),
    24: (25, 27, 31),
    25: (31,),
    26: (29, 33),
    27: (33,),
    28: (31, 33),
    29: (32, 33),
    30: (32, 33),
    31: (32, 33),
    32: (33,),
}
# node v's faction: KARATE_CLASSES[int(_KARATE_FACTION[v])]
_KARATE_FACTION = "0000000001000011001010111111111111"


def karate_edges() -> np.ndarray:
    """int64 [78, 2]: the undirected edges (u < v), sorted."""
    return np.array([(u, v) for u, vs in sorted(_KARATE_ADJ.items()) for v in vs], dtype=np.int64)


def karate_labels() -> np.ndarray:
    """int64 [34]: each member's faction (index into KARATE_CLASSES)."""
    return np.array([int(c) for c in _KARATE_FACTION], dtype=np.int64)


def load_karate(train_per_class: int = 4, num_val: int = 10, seed: int = 0) -> Graph:
    """Zachary's karate club as an undirected Graph (both directions stored, rows sorted).

    Split (deterministic per ``seed``): ``train_per_class`` nodes of each class for training,
    ``num_val`` of the rest for validation, all remaining nodes for test (default 8/10/16).
    """
    y = karate_labels()
    n = len(y)
    e = karate_edges()
    rng = np.random.default_rng(seed)
    train = np.zeros(n, dtype=bool)
    for c in range(len(KARATE_CLASSES)):
        ids = np.flatnonzero(y == c)
        train[rng.choice(ids, size=min(train_per_class, len(ids)), replace=False)] = True
    rest = rng.permutation(np.flatnonzero(~train))
    val = np.zeros(n, dtype=bool)
    val[rest[:num_val]] = True
    test = ~(train | val)
    return graph_from_edges(e[:, 0], e[:, 1], source="<embedded karate club>", name="karate",
                            num_nodes=n, x=np.eye(n, dtype=np.float32), y=y, train_mask=train,
                            val_mask=val, test_mask=test, to_undirected=True)
