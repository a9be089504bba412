"""Training inputs of a graph: features, labels, train/val/test masks, filling what is missing.

Every rank calls `prepare_graph` on the same graph and gets the same arrays (the split is seeded).
With ``deferred=True`` (full-graph training) nothing is read yet: each rank later asks for its
rows [lo, hi) only (`PreparedGraph.rows` / `DeferredPrepared.rows`); the global figures (training
node count, number of classes) come from an all-reduce, so a memory-mapped graph
(``Graph.mapped``) is read only at the rank's rows. Missing masks are the exception: the seeded
split permutes all labelled nodes, so ``y`` is then read whole (N int64, like ``indptr``) and
the split computed as `prepare_graph` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PreparedGraph", "PreparedRows", "DeferredPrepared", "prepare_graph"]


@dataclass
class PreparedGraph:
    """Global arrays a training loop needs (every rank holds the same ones)."""

    x: np.ndarray          # float32 [N, F]
    y: np.ndarray          # int64 [N]
    train: np.ndarray      # bool [N]
    val: np.ndarray        # bool [N]
    test: np.ndarray       # bool [N]
    num_classes: int

    def rows(self, lo: int, hi: int, comm=None) -> "PreparedRows":
        """Rows [lo, hi) (copies); the global figures come from the whole arrays (`comm` unused)."""
        return PreparedRows(*(np.ascontiguousarray(a[lo:hi]) for a in (self.x, self.y, self.train, self.val, self.test)),
                            num_classes=self.num_classes, n_train=int(self.train.sum()))


@dataclass
class PreparedRows:
    """One rank's rows [lo, hi) of a prepared graph plus the global figures training needs."""

    x: np.ndarray          # float32 [n, F]
    y: np.ndarray          # int64 [n]
    train: np.ndarray      # bool [n]
    val: np.ndarray        # bool [n]
    test: np.ndarray       # bool [n]
    num_classes: int       # over the whole graph
    n_train: int           # training nodes of the whole graph


@dataclass
class DeferredPrepared:
    """`prepare_graph(graph, seed, deferred=True)`: nothing read yet; `rows` reads rows [lo, hi)."""

    graph: Any
    seed: int = 0
    num_classes: int | None = None  # None: max(y) + 1 over all ranks' rows (mgg.train: mgg.data.labels)

    @property
    def num_features(self) -> int:
        x = getattr(self.graph, "x", None)
        return 2 if x is None else (1 if x.ndim == 1 else int(x.shape[1]))

    def rows(self, lo: int, hi: int, comm) -> PreparedRows:
        """Rows [lo, hi), validated (mgg.data.validate.validate_rows) and filled as
        `prepare_graph` fills them; num_classes and n_train are all-reduced over `comm`
        (anything with ``check(err)`` and ``allreduce_scalar(v, op)``). Collective: a bad row on
        any rank raises on every rank (`comm.check`)."""
        from .validate import validate_rows

        g, err, out = self.graph, None, None
        try:
            if getattr(g, "y", None) is None:
                raise ValueError(f"dataset {getattr(g, 'name', '?')!r} has no labels (y); cannot train")
            d = validate_rows(g, lo, hi)
            y = d["y"]
            x = d["x"] if d["x"] is not None else _default_features(np.asarray(g.indptr[lo:hi + 1]), hi - lo)
            masks = [d[k] for k in ("train_mask", "val_mask", "test_mask")]
            if any(m is None for m in masks):  # the seeded split needs every label: y read whole
                n = int(len(g.indptr) - 1)
                masks = [m[lo:hi] for m in _user_split(np.asarray(g.y, dtype=np.int64).reshape(n), n, self.seed,
                                                       getattr(g, "user_ids", None))]
            train_m, val_m, test_m = (np.asarray(m, dtype=bool) & (y >= 0) for m in masks)
            # rows read from a file are fresh arrays: no copy where they already are float32 / int64
            out = (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64),
                   train_m, val_m, test_m)
        except Exception as e:  # noqa: BLE001 - agreed on below
            err = e
        comm.check(err)
        x, y, train_m, val_m, test_m = out
        n_train = int(comm.allreduce_scalar(int(train_m.sum()), "sum"))
        y_max = int(comm.allreduce_scalar(int(y.max()) if len(y) else -1, "max"))
        if n_train == 0:
            raise ValueError("dataset has no training nodes (train_mask is all False)")
        classes = self.num_classes if self.num_classes is not None else max(y_max + 1, 1)
        return PreparedRows(x, y, train_m, val_m, test_m, num_classes=classes, n_train=n_train)


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


def _user_split(y: np.ndarray, n: int, seed: int, user_ids) -> list[np.ndarray]:
    """`_random_split` drawn in the user's node ids (``Graph.user_ids``, int [n] or None) and
    returned in the graph's order: a relabelled graph gets the split its input order gets."""
    if user_ids is None:
        return _random_split(y, n, seed)
    ids = np.asarray(user_ids, dtype=np.int64)
    y_user = np.empty_like(y)
    y_user[ids] = y
    return [m[ids] for m in _random_split(y_user, n, seed)]


def labels_hint() -> str:
    """Which dataset formats carry labels (from the format registry), for messages."""
    from .formats import FORMATS

    carry = [f.describe for f in FORMATS if f.labels]
    return ("Give the labels in a format that carries them: " + " or ".join(carry)
            + " (an .npz holds y and, optionally, x and train/val/test masks beside indptr/indices or edge_index)")


def prepare_graph(graph: Any, seed: int = 0, deferred: bool = False) -> PreparedGraph | DeferredPrepared:
    """Features, labels and masks of `graph`, filling what is missing.

    ``deferred=True``: a `DeferredPrepared` that reads each rank's rows when asked (see the
    module docstring); the rows equal those of the whole-array result.

    Missing features become [1, log(1 + in-degree)]; missing masks a seeded 60/20/20 split of the
    labelled nodes; unlabelled nodes (y == -1) are removed from every mask.
    Raises ValueError when the graph has no labels or no training nodes.
    """
    if deferred:
        if getattr(graph, "y", None) is None:
            raise ValueError(f"dataset {getattr(graph, 'name', '?')!r} has no labels (y); cannot train. "
                             f"{labels_hint()}")
        return DeferredPrepared(graph, seed)
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
        masks = _user_split(y, n, seed, getattr(graph, "user_ids", None))
    # unlabelled nodes (y == -1) never count, whatever the masks say
    train_m, val_m, test_m = (np.asarray(m, dtype=bool) & (y >= 0) for m in masks)
    if not train_m.any():
        raise ValueError("dataset has no training nodes (train_mask is all False)")
    num_classes = int(getattr(graph, "num_classes", 0) or 0)
    num_classes = max(num_classes, int(y.max()) + 1 if n else 1, 1)
    return PreparedGraph(x, y, train_m, val_m, test_m, num_classes)
