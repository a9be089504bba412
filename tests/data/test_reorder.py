"""mgg.data.reorder: relabelled graphs are the same graph under perm, aggregation commutes with the
relabelling, each order does what its name says, and bad input fails clearly."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from mgg.data import Graph, load_dataset
from mgg.data.reorder import (METHODS, inverse_permutation, permute_graph, reorder_nodes,
                              to_new_order, to_old_order)
from mgg.testing.reference import aggregate_reference
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig

from mgg.testing.graphs import random_csr


def _random_graph(n: int = 60, e: int = 400, seed: int = 0) -> Graph:
    """Directed, with self loops, duplicates, isolated nodes, unsorted rows and node data."""
    indptr, indices = random_csr(n, e, seed)
    rng = np.random.default_rng(seed + 1)
    u = rng.random(n)
    return Graph(indptr, indices, x=rng.standard_normal((n, 5)).astype(np.float32),
                 y=rng.integers(-1, 4, n), train_mask=u < 0.5, val_mask=(u >= 0.5) & (u < 0.7),
                 test_mask=u >= 0.7, name="rand")


def _edges(g: Graph) -> Counter:
    """Multiset of (source, target) pairs, read row by row in plain Python."""
    out = Counter()
    for i in range(g.num_nodes):
        for j in g.indices[g.indptr[i]:g.indptr[i + 1]]:
            out[(int(j), i)] += 1
    return out


GRAPHS = {"random": lambda: _random_graph(), "sbm": lambda: load_dataset("sbm", scale=0.02, seed=3),
          "powerlaw": lambda: load_dataset("products-like", scale=0.0005, seed=1)}


def _needs(method: str) -> None:
    if method == "metis":
        pytest.importorskip("pymetis")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_reordered_graph_is_isomorphic_under_perm(name, method):
    _needs(method)
    g = GRAPHS[name]()
    g2, perm = reorder_nodes(g, method)
    n = g.num_nodes
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(n))
    inv = inverse_permutation(perm)
    expected = Counter({(int(inv[j]), int(inv[i])): c for (j, i), c in _edges(g).items()})
    assert _edges(g2) == expected
    assert g2.indptr.dtype == np.int64 and g2.indices.dtype == np.int64
    assert g2.indptr[0] == 0 and g2.indptr[-1] == g.num_edges and len(g2.indptr) == n + 1
    for k in range(n):  # node data follows its node
        assert np.array_equal(g2.x[k], g.x[perm[k]])
        assert g2.y[k] == g.y[perm[k]]
        assert g2.train_mask[k] == g.train_mask[perm[k]]
        assert g2.val_mask[k] == g.val_mask[perm[k]]
        assert g2.test_mask[k] == g.test_mask[perm[k]]
    if method != "none":  # the input's id of every node travels with it
        np.testing.assert_array_equal(g2.user_ids, perm)
    if method != "none":  # rows re-sorted ascending
        t = g2.targets()
        assert np.all((np.diff(g2.indices) >= 0) | (np.diff(t) != 0))


def test_none_is_the_identity_and_returns_the_input():
    g = _random_graph()
    g2, perm = reorder_nodes(g, "none")
    assert g2 is g and np.array_equal(perm, np.arange(g.num_nodes))


def test_unsorted_rows_keep_their_order_when_asked():
    g = _random_graph(seed=4)
    perm = np.random.default_rng(0).permutation(g.num_nodes)
    g2 = permute_graph(g, perm, sort_rows=False)
    inv = inverse_permutation(perm)
    for k in range(g.num_nodes):
        old = perm[k]
        assert np.array_equal(g2.indices[g2.indptr[k]:g2.indptr[k + 1]],
                              inv[g.indices[g.indptr[old]:g.indptr[old + 1]]])


@pytest.mark.parametrize("method", METHODS)
def test_round_trip(method):
    _needs(method)
    g = _random_graph(seed=7)
    g2, perm = reorder_nodes(g, method)
    inv = inverse_permutation(perm)
    assert np.array_equal(inv[perm], np.arange(g.num_nodes))
    assert np.array_equal(perm[inv], np.arange(g.num_nodes))
    assert np.array_equal(to_old_order(to_new_order(g.x, perm), perm), g.x)
    back = permute_graph(g2, inv)  # relabelling by the inverse restores the graph (rows sorted)
    ref = g.sort_rows()
    assert np.array_equal(back.indptr, ref.indptr) and np.array_equal(back.indices, ref.indices)
    assert np.array_equal(back.x, g.x) and np.array_equal(back.y, g.y)


@pytest.mark.parametrize("method", ["degree", "rcm", "cluster", "metis"])
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn"])
def test_aggregation_commutes_with_reordering(method, kind):
    """mgg's CPU executor on the reordered graph == the float64 oracle on the original, permuted."""
    _needs(method)
    g = _random_graph(n=80, e=700, seed=11)
    g2, perm = reorder_nodes(g, method)
    x = np.random.default_rng(2).standard_normal((g.num_nodes, 6))
    want = aggregate_reference(g.indptr, g.indices, x, kind)  # original ids
    want_t = aggregate_reference(g.indptr, g.indices, x, kind, transposed=True)
    with DistGraph.build(g2, Communicator(), RuntimeConfig(ps=3, dist=2, wpb=2, backend="cpu")) as dg:
        xt = torch.from_numpy(to_new_order(x, perm).astype(np.float32))
        got = dg.aggregate(xt, kind).numpy()
        got_t = dg.aggregate(xt, kind, transposed=True).numpy()
    np.testing.assert_allclose(to_old_order(got, perm), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_old_order(got_t, perm), want_t, rtol=1e-5, atol=1e-5)
    # and the oracle itself on the reordered graph
    np.testing.assert_allclose(aggregate_reference(g2.indptr, g2.indices, x[perm], kind), want[perm],
                               rtol=1e-12, atol=1e-12)


def test_degree_order_is_descending_and_stable():
    g = _random_graph(seed=5)
    g2, perm = reorder_nodes(g, "degree")
    deg = g.in_degree()
    assert np.all(np.diff(deg[perm]) <= 0)
    assert np.array_equal(g2.in_degree(), deg[perm])
    for d in np.unique(deg):  # ties keep the old order
        same = perm[deg[perm] == d]
        assert np.all(np.diff(same) > 0)


def _shuffled(indptr_indices: tuple[np.ndarray, np.ndarray], seed: int) -> tuple[Graph, np.ndarray]:
    g = Graph(*indptr_indices)
    shuffle = np.random.default_rng(seed).permutation(g.num_nodes)
    return permute_graph(g, shuffle), shuffle


def _bandwidth(g: Graph) -> int:
    return int(np.abs(g.targets() - g.indices).max()) if g.num_edges else 0


def test_rcm_recovers_a_path_from_a_shuffle():
    n = 200  # undirected path 0 - 1 - ... - n-1: bandwidth 1, destroyed by a random relabelling
    src = np.concatenate([np.arange(n - 1), np.arange(1, n)])
    dst = np.concatenate([np.arange(1, n), np.arange(n - 1)])
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    g, _ = _shuffled((indptr, src[order].astype(np.int64)), seed=0)
    assert _bandwidth(g) > 10
    g2, _ = reorder_nodes(g, "rcm")
    assert _bandwidth(g2) == 1


def test_cluster_puts_each_community_in_one_contiguous_range():
    # three disjoint directed cliques of sizes 30, 20, 10, relabelled at random
    sizes, src, dst, start = (30, 20, 10), [], [], 0
    for s in sizes:
        a, b = np.meshgrid(np.arange(start, start + s), np.arange(start, start + s))
        keep = a != b
        src.append(a[keep]), dst.append(b[keep])
        start += s
    src, dst = np.concatenate(src), np.concatenate(dst)
    n = start
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    g, shuffle = _shuffled((indptr, src[order].astype(np.int64)), seed=1)
    community = np.repeat(np.arange(3), sizes)[shuffle]  # community of each shuffled node
    _, perm = reorder_nodes(g, "cluster")
    laid_out = community[perm]
    # largest community first, each one contiguous
    assert np.array_equal(laid_out, np.repeat(np.arange(3), sizes))


def test_empty_and_edgeless_graphs():
    for n in (0, 5):
        g = Graph(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
        for m in METHODS:
            if m == "metis" and not _have_pymetis():
                continue
            g2, perm = reorder_nodes(g, m)
            assert g2.num_nodes == n and g2.num_edges == 0 and len(perm) == n


def _have_pymetis() -> bool:
    from mgg.data.metis_order import have_pymetis

    return have_pymetis()


def test_bad_method_names_it_and_the_allowed_values():
    g = _random_graph()
    with pytest.raises(ValueError, match=r"'spectral'.*none, degree, rcm, cluster, metis"):
        reorder_nodes(g, "spectral")


def test_bad_perm_is_rejected():
    g = _random_graph()
    with pytest.raises(ValueError, match="repeats"):
        permute_graph(g, np.zeros(g.num_nodes, dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        permute_graph(g, np.arange(g.num_nodes - 1))
    with pytest.raises(ValueError, match=r"\[0, "):
        inverse_permutation(np.array([0, 5, 1]))


def _label_propagation_numpy(a, rounds: int, seed: int = 0) -> np.ndarray:
    """A numpy label propagation for "cluster" (on the scipy pattern A + A^T),
    kept as the oracle of the torch one: the same random draws must give the same labels."""
    n = a.shape[0]
    labels = np.arange(n, dtype=np.int64)
    if n == 0 or a.nnz == 0:
        return labels
    rng = np.random.default_rng(seed)
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(a.indptr))
    col = a.indices.astype(np.int64)
    has = np.diff(a.indptr) > 0
    for _ in range(rounds):
        prio = rng.permutation(n)
        label_of_prio = np.empty(n, dtype=np.int64)
        label_of_prio[prio] = np.arange(n, dtype=np.int64)
        key = np.sort(row * n + prio[labels[col]])
        first = np.ones(len(key), dtype=bool)
        first[1:] = key[1:] != key[:-1]
        starts = np.flatnonzero(first)
        counts = np.diff(np.append(starts, len(key)))
        node, lab = np.divmod(key[starts], n)
        lab = label_of_prio[lab]
        group = np.ones(len(node), dtype=bool)
        group[1:] = node[1:] != node[:-1]
        gstart = np.flatnonzero(group)
        best_count = np.maximum.reduceat(counts, gstart)
        is_best = counts == np.repeat(best_count, np.diff(np.append(gstart, len(node))))
        cand = np.flatnonzero(is_best)
        keep = np.ones(len(cand), dtype=bool)
        keep[1:] = node[cand[1:]] != node[cand[:-1]]
        cand = cand[keep]
        new = labels.copy()
        new[node[cand]] = lab[cand]
        update = has & (rng.random(n) < 0.5)
        changed = update & (new != labels)
        labels = np.where(update, new, labels)
        if not changed.any():
            break
    return labels


@pytest.mark.parametrize("name", ["random", "sbm", "powerlaw"])
@pytest.mark.parametrize("seed", [0, 5])
def test_torch_label_propagation_equals_the_numpy_one(name, seed):
    """The pattern (A + A^T, duplicates merged) equals scipy's, and the torch label propagation
    (which runs on the GPU when asked) gives exactly the numpy oracle's labels."""
    from mgg.data.reorder import _label_propagation, _pattern, _sym_pattern_coo

    g = GRAPHS[name]()
    a = _pattern(g, symmetric=True)
    row, col = _sym_pattern_coo(g, "cpu")
    want_row = np.repeat(np.arange(g.num_nodes), np.diff(a.indptr))
    np.testing.assert_array_equal(row.numpy(), want_row)
    np.testing.assert_array_equal(col.numpy(), a.indices)  # scipy's canonical CSR: columns ascend
    got = _label_propagation(row, col, g.num_nodes, 10, seed).numpy()
    want = _label_propagation_numpy(a, 10, seed)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) < g.num_nodes  # it did merge nodes
    # the host's sparse-product version (what "cluster" runs on a CPU) too
    from mgg.data.label_propagation import label_propagation_sparse

    np.testing.assert_array_equal(label_propagation_sparse(a, 10, seed), want)
