"""Label propagation on the host by sparse products: the "cluster" order's communities on a CPU.

One round counts, for every node, its neighbours' labels with one sparse product ``A @ L`` (A the
symmetric 0/1 pattern, L the [N, N] one-hot matrix of the current labels: scipy's SMMP
accumulates each row in one pass, no sort) and takes per row the label of the largest count,
ties to the label of smallest random priority: one ``maximum.reduceat`` over
``count * (N + 1) + (N - priority)``. The random draws, their order and the update rule are those
of `mgg.data.reorder._label_propagation` (the torch version, for GPUs), so both give the same labels.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["label_propagation_sparse"]


def label_propagation_sparse(a: sp.csr_matrix, rounds: int, seed: int = 0) -> np.ndarray:
    """int64 [N] community labels of the symmetric pattern `a` (scipy CSR [N, N], 0/1 entries,
    duplicates merged). Each round every node takes the most frequent label among its neighbours
    (ties: smallest priority in a fresh random permutation of the labels; isolated nodes keep
    theirs); a random half of the nodes updates per round; starts from label = node id, stops
    early when no label changes."""
    n = a.shape[0]
    labels = np.arange(n, dtype=np.int64)
    if n == 0 or a.nnz == 0:
        return labels
    rng = np.random.default_rng(seed)
    deg = np.diff(a.indptr)
    has = deg > 0
    rows = np.flatnonzero(has)
    a = sp.csr_matrix((np.ones(a.nnz, dtype=np.int32), a.indices, a.indptr), shape=(n, n))
    ones = np.ones(n, dtype=np.int32)
    node_ptr = np.arange(n + 1, dtype=np.int64)
    for _ in range(rounds):
        prio = rng.permutation(n)  # label -> priority; ties go to the smallest
        label_of_prio = np.empty(n, dtype=np.int64)
        label_of_prio[prio] = np.arange(n, dtype=np.int64)
        counts = a @ sp.csr_matrix((ones, labels, node_ptr), shape=(n, n))  # [i, l]: neighbours of i labelled l
        score = counts.data.astype(np.int64) * (n + 1) + (n - prio[counts.indices])
        del counts.data
        best = np.maximum.reduceat(score, counts.indptr[rows])  # rows with neighbours are non-empty
        del score, counts
        new = labels.copy()
        new[rows] = label_of_prio[n - best % (n + 1)]
        update = has & (rng.random(n) < 0.5)
        changed = update & (new != labels)
        labels = np.where(update, new, labels)
        if not changed.any():
            break
    return labels
