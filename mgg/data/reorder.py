"""Optional node reordering before partitioning (locality for the contiguous-range partitioner).

mgg partitions nodes into contiguous id ranges (mgg.runtime.partition), so the node numbering
decides which edges cross ranks and how many unique remote rows (the halo) each rank reads. This
module relabels a graph's nodes; it never changes the edge set.

Convention: ``perm`` is int64 [N] with ``perm[new] = old`` (new node ``k`` is old node
``perm[k]``); ``inverse_permutation(perm)`` gives ``inv[old] = new``. Per-node arrays go
old -> new with ``a[perm]`` (:func:`to_new_order`) and back with ``a_new[inv]``
(:func:`to_old_order`). An edge ``j -> i`` of the input becomes ``inv[j] -> inv[i]``.

Methods (``METHODS``):

* ``none``   -- identity (the input graph object itself is returned).
* ``degree`` -- in-degree descending, ties by old id (stable).
* ``rcm``    -- reverse Cuthill-McKee (scipy.sparse.csgraph) on the symmetrised pattern: a
  bandwidth-reducing BFS order, so neighbours get nearby ids.
* ``cluster`` -- communities found by a few rounds of vectorised label propagation on the
  symmetrised pattern, laid out one after another (largest first); inside a community, in-degree
  descending. A cheap stand-in for Rabbit-order-like clustering orders; runs on the GPU
  (``device="cuda"``) in seconds.
* ``metis``  -- parts of a METIS recursive bisection, one after another
  (mgg.data.metis_order; needs pymetis): nested, so the ranges of every P = 2, 4, 8, ... hold
  whole parts.

The relabelled graph records the input's id of every node in ``Graph.user_ids`` (composed
over successive relabellings), which mgg.prepare stores in the file. Which order the tools
pick by default (``auto``) is mgg.data.locality's rule; measurements in docs/partition.md
(bench/partition_locality.py) and docs/reorder.md (bench/reorder.py).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

from .graph import Graph

__all__ = ["METHODS", "reorder_nodes", "permutation", "permute_graph", "inverse_permutation",
           "to_new_order", "to_old_order", "to_user_order"]

METHODS = ("none", "degree", "rcm", "cluster", "metis")

# CSR entries handled per chunk when gathering and sorting rows (bounded temporaries).
_EDGE_CHUNK = 1 << 22
# rounds of label propagation of the "cluster" method
_LP_ROUNDS = 10


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown reorder method {method!r}; expected one of {', '.join(METHODS)}")


def inverse_permutation(perm: np.ndarray) -> np.ndarray:
    """int64 [N] ``inv`` with ``inv[perm[k]] = k`` (old id -> new id).

    Raises ValueError when ``perm`` is not a permutation of ``[0, N)``.
    """
    perm = np.asarray(perm, dtype=np.int64)
    n = len(perm)
    if perm.ndim != 1 or (n and (perm.min() < 0 or perm.max() >= n)):
        raise ValueError(f"inverse_permutation: perm must be a 1-D array of ids in [0, {n})")
    inv = np.full(n, -1, dtype=np.int64)
    inv[perm] = np.arange(n, dtype=np.int64)
    if n and inv.min() < 0:
        raise ValueError("inverse_permutation: perm repeats an id (not a permutation)")
    return inv


def to_new_order(a: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Per-node array in old order ([N, ...]) -> the same data in new order: ``a[perm]``."""
    return a[perm]


def to_old_order(a_new: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Per-node array in new order ([N, ...], e.g. a model output) -> old order: ``a_new[inv]``."""
    return a_new[inverse_permutation(perm)]


def to_user_order(a: np.ndarray, graph: Graph) -> np.ndarray:
    """Per-node array in `graph`'s order ([N, ...], e.g. predictions or embeddings) -> the same
    rows in the user's node ids (``Graph.user_ids``; `a` itself for a graph in the user's order)."""
    if graph.user_ids is None:
        return a
    out = np.empty_like(a)
    out[np.asarray(graph.user_ids, dtype=np.int64)] = a
    return out


# -------------------------------------------------------------------------------- orders
def _pattern(graph: Graph, symmetric: bool) -> sp.csr_matrix:
    """The N x N 0/1 pattern (int8, duplicates merged), A[i, j] = 1 for an edge j -> i;
    with `symmetric`, A + A^T."""
    n = graph.num_nodes
    import scipy.sparse as sp  # imported on first use: slow to import

    a = sp.csr_matrix((np.ones(graph.num_edges, dtype=np.int8), graph.indices, graph.indptr),
                      shape=(n, n))
    a.sum_duplicates()
    if symmetric:
        a = (a + a.T.tocsr()).tocsr()
        a.data[:] = 1
    return a


def _degree_order(graph: Graph) -> np.ndarray:
    deg = graph.in_degree()
    return np.argsort(-deg, kind="stable").astype(np.int64)


def _rcm_order(graph: Graph) -> np.ndarray:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    if graph.num_nodes == 0:  # scipy's RCM fails on an empty matrix
        return np.zeros(0, dtype=np.int64)
    a = _pattern(graph, symmetric=True)
    return np.asarray(reverse_cuthill_mckee(a, symmetric_mode=True), dtype=np.int64)


def _sorted(t):
    """`t` (an int64 tensor) sorted ascending: numpy's in-place sort for a CPU tensor (torch's
    CPU sort also builds the permutation, and ran the whole order 1.6x slower), else torch.sort."""
    import torch

    if t.device.type == "cpu":
        a = t.numpy()
        a.sort()
        return t
    return torch.sort(t).values


def _sym_pattern_coo(graph: Graph, device) -> tuple:
    """(row, col) int64 tensors on `device`: the entries of the symmetrised 0/1 pattern A + A^T
    (duplicates and both directions merged), sorted by row then column."""
    import torch

    n = graph.num_nodes
    dev = torch.device(device)
    indptr = torch.as_tensor(np.asarray(graph.indptr, dtype=np.int64)).to(dev)
    tgt = torch.repeat_interleave(torch.arange(n, device=dev), indptr[1:] - indptr[:-1])
    src = torch.as_tensor(np.asarray(graph.indices, dtype=np.int64)).to(dev)
    key = torch.cat([tgt * n + src, src * n + tgt])
    del tgt, src
    key = _sorted(key)
    first = torch.ones(key.numel(), dtype=torch.bool, device=dev)
    first[1:] = key[1:] != key[:-1]
    key = key[first]  # duplicates merged
    return torch.div(key, n, rounding_mode="floor"), key % n


def _label_propagation(row, col, n: int, rounds: int, seed: int = 0):
    """int64 [N] community labels (a tensor on row's device): synchronous label propagation on
    the symmetric pattern given as (row, col) int64 tensors, sorted by row.

    Each round every node takes the most frequent label among its neighbours (ties: broken by a
    fresh random priority of the labels each round; isolated nodes keep theirs). Starts from
    label = node id and updates a random half of the nodes per round, which avoids the
    two-colouring oscillation of fully synchronous updates. Vectorised: one sort of the (node,
    neighbour label priority) pairs per round, on the tensors' device (the GPU when they are
    there). The random draws come from numpy's generator (`seed`), so every device gives the same
    labels.
    """
    import torch

    dev = row.device
    labels = torch.arange(n, dtype=torch.int64, device=dev)
    if n == 0 or row.numel() == 0:
        return labels
    rng = np.random.default_rng(seed)
    has = torch.bincount(row, minlength=n) > 0
    for _ in range(rounds):
        prio = torch.as_tensor(rng.permutation(n)).to(dev)  # label -> priority; ties: smallest
        label_of_prio = torch.empty_like(prio)
        label_of_prio[prio] = torch.arange(n, dtype=torch.int64, device=dev)
        key = _sorted(row * n + prio[labels[col]])  # (node, label priority) pairs grouped
        first = torch.ones(key.numel(), dtype=torch.bool, device=dev)
        first[1:] = key[1:] != key[:-1]
        starts = torch.nonzero(first).reshape(-1)
        counts = torch.diff(starts, append=torch.tensor([key.numel()], device=dev))
        uniq = key[starts]
        del key, first, starts
        node = torch.div(uniq, n, rounding_mode="floor")
        lab = label_of_prio[uniq % n]
        # per node: the label with the largest count (ties: smallest priority, the first in order)
        best = torch.zeros(n, dtype=counts.dtype, device=dev).scatter_reduce(0, node, counts, "amax")
        cand = torch.nonzero(counts == best[node]).reshape(-1)
        keep = torch.ones(cand.numel(), dtype=torch.bool, device=dev)
        keep[1:] = node[cand[1:]] != node[cand[:-1]]
        cand = cand[keep]
        new = labels.clone()
        new[node[cand]] = lab[cand]
        update = has & torch.as_tensor(rng.random(n) < 0.5).to(dev)
        changed = update & (new != labels)
        labels = torch.where(update, new, labels)
        if not bool(changed.any()):
            break
    return labels


def _cluster_order(graph: Graph, device="cpu") -> np.ndarray:
    """Communities of the label propagation (on a CPU by sparse products,
    mgg.data.label_propagation; elsewhere by torch sorts on `device`: the same labels)."""
    import torch

    if torch.device(device).type == "cpu":
        from .label_propagation import label_propagation_sparse

        labels = label_propagation_sparse(_pattern(graph, symmetric=True), _LP_ROUNDS)
    else:
        row, col = _sym_pattern_coo(graph, device)
        labels = _label_propagation(row, col, graph.num_nodes, _LP_ROUNDS).cpu().numpy()
        del row, col
    _, comp, size = np.unique(labels, return_inverse=True, return_counts=True)
    comp = comp.reshape(-1)
    # communities largest first (ties: smallest label), inside one: in-degree descending, then id
    rank_of_comp = np.empty(len(size), dtype=np.int64)
    rank_of_comp[np.lexsort((np.arange(len(size)), -size))] = np.arange(len(size))
    return np.lexsort((np.arange(graph.num_nodes), -graph.in_degree(), rank_of_comp[comp])).astype(np.int64)


def permutation(graph: Graph, method: str, device="cpu") -> np.ndarray:
    """int64 [N] ``perm`` (``perm[new] = old``) of `method` for `graph`, without relabelling.
    `device`: where "cluster" runs its label propagation (torch; "cuda" on a GPU machine); the
    result does not depend on it. "metis" raises ValueError when pymetis is not installed."""
    _check_method(method)
    if method == "none":
        return np.arange(graph.num_nodes, dtype=np.int64)
    if method == "degree":
        return _degree_order(graph)
    if method == "rcm":
        return _rcm_order(graph)
    if method == "metis":
        from .metis_order import metis_order

        return metis_order(graph)
    return _cluster_order(graph, device)


# --------------------------------------------------------------------------- relabelling
def permute_graph(graph: Graph, perm: np.ndarray, sort_rows: bool = True) -> Graph:
    """The graph relabelled by ``perm`` (``perm[new] = old``): edge j -> i becomes
    inv[j] -> inv[i]; x, y and the masks follow (``a[perm]``).

    Args:
        graph: target-major CSR Graph (indptr int64 [N+1], indices int64 [E]).
        perm: int64 [N], a permutation of [0, N).
        sort_rows: sort the sources inside every new row ascending (else rows keep the input's
            entry order, relabelled).

    Returns:
        A new Graph with int64 CSR; the same edge multiset under the relabelling, and
        ``user_ids`` = the input's user ids in the new order (``arange(N)[perm]`` = ``perm`` for
        a graph in the user's order).
    """
    n, e = graph.num_nodes, graph.num_edges
    perm = np.asarray(perm, dtype=np.int64)
    if perm.shape != (n,):
        raise ValueError(f"permute_graph: perm has shape {perm.shape}, expected ({n},)")
    inv = inverse_permutation(perm)
    indptr_old = np.asarray(graph.indptr, dtype=np.int64)
    indices_old = np.asarray(graph.indices, dtype=np.int64)
    deg = np.diff(indptr_old)[perm]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    indices = np.empty(e, dtype=np.int64)
    shift = indptr_old[perm] - indptr[:-1]  # old position = new position + shift[new row]
    row = 0
    while row < n:
        # new rows [row, hi) holding about _EDGE_CHUNK entries (at least one row)
        hi = int(np.searchsorted(indptr, indptr[row] + _EDGE_CHUNK, side="right")) - 1
        hi = min(max(hi, row + 1), n)
        e0, e1 = int(indptr[row]), int(indptr[hi])
        if e1 > e0:
            pos = np.arange(e0, e1, dtype=np.int64)
            local = np.repeat(np.arange(hi - row, dtype=np.int64), deg[row:hi])
            pos += shift[row:hi][local]
            src = inv[indices_old[pos]]
            if sort_rows:
                key = local * n + src  # rows of the chunk stay in order, sources ascend within
                key.sort()
                src = key - local * n  # `local` is non-decreasing, so it matches sorted keys
            indices[e0:e1] = src
        row = hi

    def follow(a):
        return None if a is None else np.asarray(a)[perm]

    user_ids = perm if graph.user_ids is None else np.asarray(graph.user_ids, dtype=np.int64)[perm]
    return dataclasses.replace(graph, indptr=indptr, indices=indices, x=follow(graph.x),
                               y=follow(graph.y), train_mask=follow(graph.train_mask),
                               val_mask=follow(graph.val_mask), test_mask=follow(graph.test_mask),
                               user_ids=user_ids, mapped=False)


def reorder_nodes(graph: Graph, method: str, sort_rows: bool = True, device="cpu") -> tuple[Graph, np.ndarray]:
    """Relabel the nodes of `graph` by `method` (one of ``METHODS``); `device`: where "cluster"
    runs (see :func:`permutation`).

    Returns:
        ``(reordered Graph, perm)`` with perm int64 [N], ``perm[new] = old``; map results back
        with :func:`to_old_order` (or ``inverse_permutation(perm)``). ``method="none"`` returns
        `graph` itself and the identity.

    Raises:
        ValueError: unknown method (the message lists the valid ones).
    """
    _check_method(method)
    perm = permutation(graph, method, device)
    if method == "none":
        return graph, perm
    return permute_graph(graph, perm, sort_rows=sort_rows), perm
