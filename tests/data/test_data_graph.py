"""Graph container: sizes, reverse, edge_index, fingerprint (mgg.data.graph)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mgg.data import Graph, csr_from_edges, validate_graph


def _small():
    # edges j -> i: 0->1, 2->1, 1->0, 2->2(self), 0->2
    src = np.array([0, 2, 1, 2, 0])
    dst = np.array([1, 1, 0, 2, 2])
    indptr, indices = csr_from_edges(src, dst, 3)
    return Graph(indptr, indices, y=np.array([0, 2, -1]), name="small")


def test_csr_orientation_rows_are_targets():
    g = _small()
    assert g.indptr.tolist() == [0, 1, 3, 5]
    assert g.indices[g.indptr[1]:g.indptr[2]].tolist() == [0, 2]  # sources of edges into node 1
    assert g.in_degree().tolist() == [1, 2, 2]
    assert g.out_degree().tolist() == [2, 1, 2]
    ei = g.edge_index()
    assert ei.shape == (2, 5) and ei.dtype == np.int64
    assert sorted(map(tuple, ei.T.tolist())) == sorted([(0, 1), (2, 1), (1, 0), (2, 2), (0, 2)])


def test_sizes_and_classes():
    g = _small()
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (3, 5, 0, 3)
    assert Graph(g.indptr, g.indices).num_classes == 0
    assert Graph(g.indptr, g.indices, y=np.array([-1, -1, -1])).num_classes == 0


def test_reverse_transposes():
    g = _small()
    r = g.reverse()
    fwd = sorted(map(tuple, g.edge_index().T.tolist()))
    bwd = sorted((t, s) for s, t in r.edge_index().T.tolist())
    assert fwd == bwd
    assert r.y is g.y  # node data kept


def test_fingerprint_stable_and_sensitive():
    g = _small()
    assert g.fingerprint() == _small().fingerprint()
    assert len(g.fingerprint()) == 32 and int(g.fingerprint(), 16) >= 0
    h = Graph(g.indptr, np.array([0, 2, 0, 2, 1]), y=g.y)
    assert h.fingerprint() != g.fingerprint()


@st.composite
def random_edges(draw):
    n = draw(st.integers(1, 30))
    e = draw(st.integers(0, 120))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    return n, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(random_edges())
def test_random_csr_roundtrip_and_double_reverse(case):
    n, src, dst = case
    indptr, indices = csr_from_edges(src, dst, n)
    g = validate_graph(Graph(indptr, indices, name="h"), "<hypothesis>")
    assert g.num_nodes == n and g.num_edges == len(src)
    # the CSR holds exactly the input multiset of edges
    assert sorted(map(tuple, g.edge_index().T.tolist())) == sorted(zip(src.tolist(), dst.tolist()))
    s = g.sort_rows()
    rr = s.reverse().reverse()
    assert np.array_equal(rr.indptr, s.indptr) and np.array_equal(rr.indices, s.indices)
    assert rr.fingerprint() == s.fingerprint()
    u = g.to_undirected()
    assert np.array_equal(u.reverse().indices, u.indices) and np.array_equal(u.reverse().indptr, u.indptr)
