"""Node orders for the range partition: the METIS order, the user ids a relabelled graph carries
(through the file, the split and back), the ``auto`` rule, and bad input."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from mgg.data import Graph
from mgg.data.npz import load_npz, save_npz
from mgg.data.reorder import permute_graph, reorder_nodes, to_user_order
from mgg.data.validate import GraphFormatError
from mgg.runtime.footprint import rank_footprints
from mgg.runtime.partition import partition_ranges
from mgg.testing.communities import shuffled_communities as communities


def remote_share(g: Graph, p: int) -> float:
    fps = rank_footprints(g.indptr, g.indices, p)
    return sum(f.remote_edges for f in fps) / g.num_edges


# ------------------------------------------------------------------------------ METIS order
def test_metis_order_keeps_each_community_inside_the_ranges_of_every_p():
    pytest.importorskip("pymetis")
    g, _ = communities(k=8, size=200)  # 8 disconnected communities: the ideal cut is 0
    g2, perm = reorder_nodes(g, "metis")
    assert remote_share(g, 4) > 0.5  # the shuffled ids have no locality
    for p in (2, 4, 8):  # one order, nested: every P's ranges hold whole communities
        assert remote_share(g2, p) < 0.02, p
    np.testing.assert_array_equal(g2.user_ids, perm)


def test_metis_order_is_deterministic_and_handles_degenerate_graphs():
    pytest.importorskip("pymetis")
    from mgg.data.metis_order import leaf_parts, metis_order

    g, _ = communities(k=4, size=100, cross=0.2, seed=3)
    np.testing.assert_array_equal(metis_order(g), metis_order(g))
    assert leaf_parts(10**6) == 64 and leaf_parts(100) == 8 and leaf_parts(7) == 1
    for n, src, tgt in ((1, [], []), (5, [], []), (4, [0, 1, 2, 3], [0, 1, 2, 3]),  # edgeless, self loops only
                        (40, [1, 0, 21, 20], [0, 1, 20, 21])):  # two pairs and 36 isolated nodes
        t = np.asarray(tgt, dtype=np.int64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(t, minlength=n), out=indptr[1:])
        perm = metis_order(Graph(indptr, np.asarray(src, dtype=np.int64)[np.argsort(t, kind="stable")]))
        assert sorted(perm.tolist()) == list(range(n))


def test_metis_without_pymetis_names_the_install(monkeypatch):
    g, _ = communities(k=2, size=50)
    monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis raises ImportError
    with pytest.raises(ValueError, match=r"needs the pymetis package \(pip install 'mgg\[metis\]'"):
        reorder_nodes(g, "metis")


def test_metis_that_does_not_fit_the_host_is_refused_in_one_line():
    from mgg.apps.node_order import check_metis_fits

    check_metis_fits(1000, 10_000, available=1 << 30)
    with pytest.raises(ValueError, match=r"METIS needs about .* GiB .* \(4 ranks on this host.*cluster"):
        check_metis_fits(2_449_029, 61_859_140, processes=4, available=20 << 30)


# -------------------------------------------------------------------------------- user ids
def test_user_ids_compose_over_relabellings_and_map_results_back():
    g, _ = communities(k=3, size=40, cross=0.1)
    g1, p1 = reorder_nodes(g, "degree")
    g2, p2 = reorder_nodes(g1, "rcm")
    np.testing.assert_array_equal(g2.user_ids, p1[p2])
    np.testing.assert_array_equal(to_user_order(g2.x, g2), g.x)  # rows back in the user's ids
    np.testing.assert_array_equal(to_user_order(g2.y, g2), g.y)
    assert to_user_order(g.x, g) is g.x


def test_user_ids_travel_through_the_file(tmp_path):
    g, _ = communities(k=3, size=40, cross=0.1)
    g2, perm = reorder_nodes(g, "cluster")
    save_npz(g2, tmp_path / "g.npz")
    for mmap in (False, True):
        back = load_npz(tmp_path / "g.npz", mmap=mmap)
        np.testing.assert_array_equal(np.asarray(back.user_ids), perm)
        np.testing.assert_array_equal(to_user_order(np.asarray(back.x), back), g.x)


@pytest.mark.parametrize("bad,match", [(np.zeros(120, np.int64), "not a permutation"),
                                       (np.arange(1, 121), r"must lie in \[0, 120\)"),
                                       (np.arange(119), r"shape \(119,\)")])
def test_damaged_user_ids_are_refused(tmp_path, bad, match):
    g, _ = communities(k=3, size=40)
    np.savez(tmp_path / "g.npz", indptr=g.indptr, indices=g.indices, y=g.y, user_ids=bad)
    for mmap in (False, True):  # a mapped file checks it too (the seeded split reads it)
        with pytest.raises(GraphFormatError, match=f"user_ids: .*{match}"):
            load_npz(tmp_path / "g.npz", mmap=mmap)


def test_the_seeded_split_is_drawn_in_the_user_ids():
    """A relabelled graph without masks gets the split its input order gets, node for node."""
    from mgg.data.prepare import DeferredPrepared, prepare_graph

    g, _ = communities(k=4, size=50, cross=0.1)
    g2, perm = reorder_nodes(g, "cluster")
    a, b = prepare_graph(g, seed=5), prepare_graph(g2, seed=5)
    for m in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(b, m), getattr(a, m)[perm])

    class OneRank:
        def check(self, err):
            if err is not None:
                raise err

        def allreduce_scalar(self, v, op):
            return v

    rows = DeferredPrepared(g2, seed=5).rows(30, 120, OneRank())
    np.testing.assert_array_equal(rows.train, a.train[perm][30:120])


# ------------------------------------------------------------------------------- auto rule
@pytest.fixture
def small_auto(monkeypatch):
    """The auto rule on test-sized graphs (its size floor lowered)."""
    import mgg.apps.node_order as node_order

    monkeypatch.setattr(node_order, "AUTO_MIN_NODES", 500)
    return node_order


def test_auto_reorders_an_order_without_locality(small_auto):
    g, _ = communities(k=8, size=200, cross=0.1)
    g2, choice = small_auto.choose_order(g, "cluster")
    assert choice.method == "cluster" and choice.reordered_rows <= 0.9 * choice.native_rows
    assert g2.user_ids is not None and remote_share(g2, 4) < 0.5 * remote_share(g, 4)
    assert "node order: cluster" in choice.line


def test_auto_keeps_a_local_order_without_trying_another(small_auto):
    g, _ = communities(k=8, size=200, cross=0.1)
    local, _ = reorder_nodes(g, "cluster")
    g2, choice = small_auto.choose_order(local, "cluster")
    assert g2 is local and choice.method == "none" and "is local" in choice.reason
    assert choice.native_rows is None  # decided from the sampled share alone


def test_auto_keeps_the_order_when_no_order_cuts_the_remote_rows(small_auto):
    rng = np.random.default_rng(0)  # uniform random sources: no order has locality to find
    n, d = 2000, 40
    indptr = np.arange(0, n * d + 1, d, dtype=np.int64)
    g = Graph(indptr, rng.integers(0, n, n * d))
    g2, choice = small_auto.choose_order(g, "cluster")
    assert g2 is g and choice.method == "none" and "does not cut" in choice.reason


def test_auto_leaves_small_graphs_alone():
    from mgg.apps.node_order import choose_order

    g, _ = communities(k=8, size=200, cross=0.1)
    g2, choice = choose_order(g, "cluster")
    assert g2 is g and choice.method == "none" and "below" in choice.reason


def test_remote_share_estimate_matches_the_exact_count():
    from mgg.apps.node_order import remote_share as estimate

    g, _ = communities(k=8, size=200, cross=0.3)
    exact = remote_share(g, 8)
    assert abs(estimate(g.indptr, g.indices, samples=1 << 20) - exact) < 1e-9  # all entries sampled
    assert abs(estimate(g.indptr, g.indices, samples=4000) - exact) < 0.03
    bounds = partition_ranges(g.indptr, 8)
    assert len(bounds) == 9


def test_remote_share_reads_a_mapped_file_at_few_pages():
    """The estimate reads runs of consecutive entries: a memory-mapped `indices` of many pages is
    touched at about SAMPLE_RUNS pages, not at every page (the whole file), and the estimate of a
    graph without locality stays near its exact share."""
    from mgg.apps.node_order import SAMPLE_RUNS, SAMPLES
    from mgg.apps.node_order import remote_share as estimate

    n, e = 1_000_000, 100_000_000  # 800 MB of int64 indices, never built: entry k is a hash of k
    indptr = np.linspace(0, e, n + 1).astype(np.int64)
    read: list[np.ndarray] = []

    class Recorded:  # what a memory map would read: the entries indexed
        def __getitem__(self, pos):
            pos = np.asarray(pos, dtype=np.int64)
            read.append(pos)
            return (pos * 2654435761 + 12345) % n

    share = estimate(indptr, Recorded(), samples=SAMPLES)
    pages = np.unique(np.concatenate(read) * 8 // 4096)
    assert len(pages) <= 3 * SAMPLE_RUNS < e * 8 // 4096 // 3
    assert abs(share - 7 / 8) < 0.01  # a random order: 1 - 1/8 of the edges cross 8 ranges
