"""Graphs for tests: random directed CSRs (self loops, duplicate edges, isolated nodes),
power-law CSRs with hub rows, and the built-in datasets loaded once per process."""
from __future__ import annotations

import numpy as np

__all__ = ["random_csr", "power_law_csr", "hub_graph", "cached_dataset"]


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


def power_law_csr(n: int, seed: int, hubs: int = 3, hub_deg: int = 700) -> tuple[np.ndarray, np.ndarray]:
    """int64 (indptr [n+1], indices): power-law in-degrees (capped at 200), a tenth of the rows
    isolated, and `hubs` rows of degree >= hub_deg; sources uniform over the n nodes."""
    rng = np.random.default_rng(seed)
    deg = np.minimum((rng.pareto(1.3, n) * 3).astype(np.int64), 200)
    deg[rng.choice(n, n // 10, replace=False)] = 0
    deg[rng.choice(n, hubs, replace=False)] = hub_deg + rng.integers(0, 300, hubs)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    return indptr, rng.integers(0, n, int(indptr[-1])).astype(np.int64)


_HUB_GRAPH: dict = {}


def hub_graph() -> tuple[np.ndarray, np.ndarray]:
    """The GPU aggregation tests' graph, built once per process: power_law_csr(2500, seed=7,
    hubs=4, hub_deg=3000), whose hub rows are split over several warps."""
    if "g" not in _HUB_GRAPH:
        _HUB_GRAPH["g"] = power_law_csr(2500, seed=7, hubs=4, hub_deg=3000)
    return _HUB_GRAPH["g"]


_DATASETS: dict = {}


def cached_dataset(name: str):
    """mgg.data.load_dataset(name) (sbm at scale 0.05), loaded once per process."""
    from mgg.data import load_dataset

    if name not in _DATASETS:
        _DATASETS[name] = load_dataset(name, scale=0.05 if name == "sbm" else 1.0, seed=0)
    return _DATASETS[name]
