"""Random graphs for tests: directed, with self loops, duplicate edges and isolated nodes."""
from __future__ import annotations

import numpy as np


def random_csr(num_nodes: int, num_edges: int, seed: int, self_loops: int = 10, isolated: int = 5,
               duplicates: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """int64 (indptr [N+1], indices [E']) with rows = targets, unsorted neighbors inside rows."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    k = min(self_loops, num_edges)
    dst[:k] = src[:k]
    if duplicates and num_edges:
        j = rng.integers(0, num_edges, duplicates)
        src, dst = np.concatenate([src, src[j]]), np.concatenate([dst, dst[j]])
    if isolated and num_nodes > isolated:
        iso = rng.choice(num_nodes, isolated, replace=False)
        keep = ~np.isin(src, iso) & ~np.isin(dst, iso)
        src, dst = src[keep], dst[keep]
    perm = rng.permutation(len(src))
    src, dst = src[perm], dst[perm]
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src[order].astype(np.int64)


_DATASETS: dict = {}


def cached_dataset(name: str):
    """mgg.data.load_dataset(name) (sbm at scale 0.05), loaded once per process."""
    from mgg.data import load_dataset

    if name not in _DATASETS:
        _DATASETS[name] = load_dataset(name, scale=0.05 if name == "sbm" else 1.0, seed=0)
    return _DATASETS[name]
