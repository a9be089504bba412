import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mgg.runtime.partition import (DEFAULT_NODE_SLACK, default_beta, edge_counts, owner_of,
                                   partition_ranges, range_sizes)


def _indptr(degrees):
    ip = np.zeros(len(degrees) + 1, dtype=np.int64)
    np.cumsum(np.asarray(degrees, dtype=np.int64), out=ip[1:])
    return ip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=0, max_size=200), st.integers(1, 12))
def test_ranges_cover_contiguously_and_balance(degrees, parts):
    ip = _indptr(degrees)
    n, e = len(degrees), int(ip[-1])
    b = partition_ranges(ip, parts, beta=0.0)  # Algorithm 1: edges only
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
    b = partition_ranges(ip, 2, beta=0.0)
    assert list(edge_counts(ip, b)) == [1000, 1000]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_parts"):
        partition_ranges(_indptr([1, 2]), 0)
    with pytest.raises(ValueError, match="indptr"):
        partition_ranges(np.zeros((2, 2), dtype=np.int64), 2)
    with pytest.raises(ValueError, match="beta"):
        partition_ranges(_indptr([1, 2]), 2, beta=-1.0)
    with pytest.raises(ValueError, match="node_slack"):
        partition_ranges(_indptr([1, 2]), 2, node_slack=0.5)


# -- Algorithm 1 as it was before the cost term: the reference for beta = 0 -------------------
def _reference_algorithm1(indptr, num_parts):
    indptr = np.asarray(indptr)
    n = len(indptr) - 1
    e = int(indptr[-1])
    bounds = np.empty(num_parts + 1, dtype=np.int64)
    bounds[0], bounds[num_parts] = 0, n
    last = 0
    for k in range(1, num_parts):
        target = (k * e + num_parts // 2) // num_parts
        lo, hi = last, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if indptr[mid] <= target:
                lo = mid
            else:
                hi = mid - 1
        i = lo
        if i < n and abs(int(indptr[i + 1]) - target) < abs(target - int(indptr[i])):
            i += 1
        if e == 0:
            i = max(last, (k * n) // num_parts)
        bounds[k] = i
        last = i
    return bounds


@pytest.mark.parametrize("seed", range(20))
def test_beta_zero_is_algorithm1_exactly(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    deg = rng.zipf(1.8, n).clip(max=5000) * (rng.random(n) < rng.random())  # zeros, hubs
    ip = _indptr(deg)
    for parts in (1, 2, 3, 4, 7, 16, n + 3):
        assert np.array_equal(partition_ranges(ip, parts, beta=0.0), _reference_algorithm1(ip, parts))


def _brute_bottleneck(ip, parts, beta, slack):
    """min over all contiguous splits of max_r max(cost_r / mean, nodes_r / (slack * N/P))."""
    import itertools
    n = len(ip) - 1
    mean = (ip[-1] + beta * n) / parts
    best = np.inf
    for cut in itertools.combinations_with_replacement(range(n + 1), parts - 1):
        b = np.array((0,) + cut + (n,))
        cost = np.diff(ip[b]) + beta * np.diff(b)
        best = min(best, max((cost / mean).max(), (np.diff(b) / (slack * n / parts)).max()))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=14), st.integers(2, 3),
       st.sampled_from([0.5, 3.0]), st.sampled_from([1.0, 2.4]))
def test_cost_partition_is_bottleneck_optimal(degrees, parts, beta, slack):
    ip = _indptr(degrees)
    if ip[-1] == 0:
        return
    b = partition_ranges(ip, parts, beta=beta, node_slack=slack)
    n = len(degrees)
    assert b[0] == 0 and b[-1] == n and np.all(np.diff(b) >= 0) and len(b) == parts + 1
    mean = (ip[-1] + beta * n) / parts
    got = max(((np.diff(ip[b]) + beta * np.diff(b)) / mean).max(), (np.diff(b) / (slack * n / parts)).max())
    assert got <= _brute_bottleneck(ip, parts, beta, slack) * (1 + 1e-6) + 1e-9


def _skews(ip, b):
    parts = len(b) - 1
    n, e = len(ip) - 1, int(ip[-1])
    return edge_counts(ip, b).max() / (e / parts), range_sizes(b).max() / (n / parts)


@pytest.mark.parametrize("hub_degree", [1, 100, 100_000])
def test_edges_on_few_nodes_spread_nodes_by_default(hub_degree):
    # all edges in the first 1,000 of 1,000,000 nodes: Algorithm 1 gives one rank 999,250 nodes
    deg = np.zeros(1_000_000, np.int64)
    deg[:1000] = hub_degree
    ip = _indptr(deg)
    assert range_sizes(partition_ranges(ip, 4, beta=0.0)).max() == 999_250
    b = partition_ranges(ip, 4)
    assert range_sizes(b).max() <= 1.5 * 1_000_000 / 4, b


def _degree_sorted(deg):
    return _indptr(np.sort(np.asarray(deg, np.int64))[::-1])


def test_power_law_default_balances_edges_and_nodes():
    from mgg.data.generators import preset

    # products-like shrunk to 200,000 nodes (lognormal in-degrees), sorted by degree descending
    g = preset("products-like", 200_000 / 2_449_029, seed=0)
    assert g.num_nodes == 200_000
    zipf = np.random.default_rng(0).zipf(2.0, 200_000).clip(max=200_000)
    for ip in (_degree_sorted(g.in_degree()), _degree_sorted(zipf)):
        es0, ns0 = _skews(ip, partition_ranges(ip, 8, beta=0.0))
        assert es0 < 1.1 and ns0 > 4  # Algorithm 1: edges balanced, nodes not
        es, ns = _skews(ip, partition_ranges(ip, 8))
        assert es <= 1.25 and ns <= 3.0, (es, ns)


def test_default_beta_scale_and_heap_rows():
    ip = _indptr([0, 4, 0, 6])  # E = 10 on 2 non-empty rows
    assert default_beta(ip) == pytest.approx(0.02 * 5)
    assert default_beta(_indptr([0, 0])) == 0.0
    assert DEFAULT_NODE_SLACK >= 1
