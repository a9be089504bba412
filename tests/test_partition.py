import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mgg.runtime.partition import edge_counts, owner_of, partition_ranges


def _indptr(degrees):
    ip = np.zeros(len(degrees) + 1, dtype=np.int64)
    np.cumsum(np.asarray(degrees, dtype=np.int64), out=ip[1:])
    return ip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=0, max_size=200), st.integers(1, 12))
def test_ranges_cover_contiguously_and_balance(degrees, parts):
    ip = _indptr(degrees)
    n, e = len(degrees), int(ip[-1])
    b = partition_ranges(ip, parts)
    assert b.dtype == np.int64 and len(b) == parts + 1
    assert b[0] == 0 and b[-1] == n
    assert np.all(np.diff(b) >= 0)
    maxdeg = max(degrees) if degrees else 0
    counts = edge_counts(ip, b)
    assert counts.sum() == e
    # every range holds E/P edges up to one maximum degree
    assert np.all(np.abs(counts - e / parts) <= maxdeg + 1), (counts, e / parts, maxdeg)
    # every node has exactly one owner, and it is the range containing it
    ids = np.arange(n)
    own = owner_of(ids, b)
    assert np.all((b[own] <= ids) & (ids < b[own + 1]))


def test_zero_degree_nodes_spread_evenly():
    ip = _indptr([0] * 10)
    b = partition_ranges(ip, 3)
    assert list(np.diff(b)) == [3, 3, 4]


def test_more_parts_than_nodes_gives_empty_ranges():
    ip = _indptr([3, 1])
    b = partition_ranges(ip, 5)
    assert b[0] == 0 and b[-1] == 2 and np.all(np.diff(b) >= 0)
    assert (np.diff(b) > 0).sum() <= 2
    assert list(owner_of(np.array([0, 1]), b)) == [int(np.searchsorted(b, 0, "right") - 1),
                                                   int(np.searchsorted(b, 1, "right") - 1)]


def test_hub_node_balance():
    # one hub with half of all edges: no split can do better than isolate it
    ip = _indptr([1000] + [1] * 1000)
    b = partition_ranges(ip, 2)
    assert list(edge_counts(ip, b)) == [1000, 1000]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_parts"):
        partition_ranges(_indptr([1, 2]), 0)
    with pytest.raises(ValueError, match="indptr"):
        partition_ranges(np.zeros((2, 2), dtype=np.int64), 2)
