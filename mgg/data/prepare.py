"""Training inputs of a graph: features, labels, train/val/test masks, filling what is missing.

Every rank calls `prepare_graph` on the same graph and gets the same arrays (the split is seeded).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PreparedGraph", "prepare_graph"]


@dataclass
class PreparedGraph:
    """Global arrays a training loop needs (every rank holds the same ones)."""

    x: np.ndarray          # float32 [N, F]
    y: np.ndarray          # int64 [N]
    train: np.ndarray      # bool [N]
    val: np.ndarray        # bool [N]
    test: np.ndarray       # bool [N]
    num_classes: int


def _default_features(indptr: np.ndarray, n: int) -> np.ndarray:
    """float32 [n, 2]: [1, log(1 + in-degree)] per node."""
    deg = np.diff(np.asarray(indptr)).astype(np.float32)
    return np.stack([np.ones(n, np.float32), np.log1p(deg)], axis=1)


def _random_split(y: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    """Seeded 60/20/20 split of the labelled nodes (y >= 0): bool [n] train, val, test masks."""
    labelled = np.flatnonzero(y >= 0)
    perm = labelled[np.random.default_rng(seed).permutation(len(labelled))]
    a, b = int(0.6 * len(perm)), int(0.8 * len(perm))
    masks = []
    for part in (perm[:a], perm[a:b], perm[b:]):
        m = np.zeros(n, dtype=bool)
        m[part] = True
        masks.append(m)
    return masks


def labels_hint() -> str:
    """Which dataset formats carry labels (from the format registry), for messages."""
    from .formats import FORMATS

    carry = [f.describe for f in FORMATS if f.labels]
    return ("Give the labels in a format that carries them: " + " or ".join(carry)
            + " (an .npz holds y and, optionally, x and train/val/test masks beside indptr/indices or edge_index)")


def prepare_graph(graph: Any, seed: int = 0) -> PreparedGraph:
    """Features, labels and masks of `graph`, filling what is missing.

    Missing features become [1, log(1 + in-degree)]; missing masks a seeded 60/20/20 split of the
    labelled nodes; unlabelled nodes (y == -1) are removed from every mask.
    Raises ValueError when the graph has no labels or no training nodes.
    """
    n = int(len(graph.indptr) - 1)
    if getattr(graph, "y", None) is None:
        raise ValueError(f"dataset {getattr(graph, 'name', '?')!r} has no labels (y); cannot train. "
                         f"{labels_hint()}")
    y = np.asarray(graph.y, dtype=np.int64)
    if y.shape != (n,):
        raise ValueError(f"labels have shape {y.shape}, expected ({n},)")
    x = getattr(graph, "x", None)
    if x is None:
        x = _default_features(graph.indptr, n)
    x = np.ascontiguousarray(x, dtype=np.float32)
    masks = [getattr(graph, k, None) for k in ("train_mask", "val_mask", "test_mask")]
    if any(m is None for m in masks):
        masks = _random_split(y, n, seed)
    # unlabelled nodes (y == -1) never count, whatever the masks say
    train_m, val_m, test_m = (np.asarray(m, dtype=bool) & (y >= 0) for m in masks)
    if not train_m.any():
        raise ValueError("dataset has no training nodes (train_mask is all False)")
    num_classes = int(getattr(graph, "num_classes", 0) or 0)
    num_classes = max(num_classes, int(y.max()) + 1 if n else 1, 1)
    return PreparedGraph(x, y, train_m, val_m, test_m, num_classes)
