"""mgg.sample on one process: sampling validity and uniformity, Fused-Map, feature sources,
Match-Reorder and resident reuse, the loader, the block model, bad inputs."""
from itertools import combinations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st
from scipy.stats import chi2

from mgg.testing.reference import aggregation_matrix
from mgg.nn import SAGE, SAGEBlockConv, SampledSAGE
from mgg.runtime import Communicator, LocalStore, partition_ranges
from mgg.graph import DistGraph, RuntimeConfig
from mgg.sample import (KEYS_FACTOR, Block, HostTierFeatures, NeighborLoader, ResidentCache, StoreFeatures,
                        TensorFeatures, build_id_map, check_fanouts, choose_feature_source, fetch_cost,
                        fused_map, make_feature_source, match_reorder, overlap_matrix, overlap_matrix_torch,
                        parse_size, sample_blocks, sample_edge_positions, sample_neighbors, unique_map)
from mgg.sample.idmap import hash_insert
from mgg.testing.graphs import random_csr


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def star(deg):
    """Node 0 aggregates nodes 1..deg (row 0 has deg edge positions)."""
    return np.array([0] + [deg] * (deg + 1), dtype=np.int64), np.arange(1, deg + 1, dtype=np.int64)


def block_graph(parts=8, size=40, p_in=0.3, seed=0):
    """Clustered graph: dense blocks on the diagonal, nothing between them (undirected CSR)."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for b in range(parts):
        a = rng.random((size, size)) < p_in
        r, c = np.nonzero(a | a.T)
        rows.append(r + b * size)
        cols.append(c + b * size)
    n = parts * size
    m = sp.csr_matrix((np.ones(sum(map(len, rows))), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return m.indptr.astype(np.int64), m.indices.astype(np.int64)


# -- neighbor sampling ------------------------------------------------------------------------------
@pytest.mark.parametrize("fanout", [1, 3, 7, 20, -1])
def test_sampled_neighborhoods_are_valid(fanout):
    indptr, indices = random_csr(200, 6000, seed=3)  # duplicates, self loops, isolated nodes
    adj = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(200, 200)).toarray()  # edge multiplicities
    deg = np.diff(indptr)
    seeds = np.r_[np.arange(200), np.random.default_rng(0).integers(0, 200, 50)]  # repeats allowed
    ptr, eid = sample_edge_positions(indptr, indices, torch.from_numpy(seeds), fanout, gen(1))
    ptr2, nbr = sample_neighbors(indptr, indices, torch.from_numpy(seeds), fanout, gen(1))
    assert ptr.dtype == nbr.dtype == torch.int64
    assert torch.equal(ptr, ptr2) and torch.equal(nbr, torch.from_numpy(indices)[eid])
    cnt = np.diff(ptr.numpy())
    expect = deg[seeds] if fanout == -1 else np.minimum(deg[seeds], fanout)
    assert np.array_equal(cnt, expect)                       # fanout respected, rows filled
    if fanout in (3, 7):
        assert (deg[seeds] > KEYS_FACTOR * fanout).any()     # the rejection regime ran
    if fanout in (7, 20):
        assert ((deg[seeds] > fanout) & (deg[seeds] <= KEYS_FACTOR * fanout)).any()  # the random-keys regime
    for b, s in enumerate(seeds):
        e = eid[ptr[b]:ptr[b + 1]].numpy()
        assert len(np.unique(e)) == len(e)                   # no edge position twice
        assert ((e >= indptr[s]) & (e < indptr[s + 1])).all()  # positions of this row
        v, c = np.unique(nbr[ptr[b]:ptr[b + 1]].numpy(), return_counts=True)
        assert (adj[s, v] >= c).all()                         # every sampled edge exists (with multiplicity)
        if fanout == -1:
            assert np.array_equal(np.sort(e), np.arange(indptr[s], indptr[s + 1]))


@pytest.mark.parametrize("deg,fanout", [(12, 3), (40, 3), (6, 6), (6, 10)])
def test_inclusion_is_uniform(deg, fanout):
    """Every edge position of a row is sampled with probability fanout/deg (chi-square)."""
    indptr, indices = star(deg)
    n = 6000
    ptr, eid = sample_edge_positions(indptr, indices, torch.zeros(n, dtype=torch.int64), fanout, gen(7))
    counts = np.bincount(eid.numpy(), minlength=deg)
    k = min(deg, fanout)
    assert counts.sum() == n * k
    exp = n * k / deg
    if k == deg:
        assert (counts == n).all()
        return
    stat = ((counts - exp) ** 2 / exp).sum()
    assert chi2.sf(stat, deg - 1) > 1e-3, counts


@pytest.mark.parametrize("deg,fanout", [(5, 2), (9, 2)])  # keys regime, rejection regime
def test_subsets_are_uniform(deg, fanout):
    """Every k-subset of a row is equally likely (exact uniform sampling without replacement)."""
    indptr, indices = star(deg)
    n = 20000
    ptr, eid = sample_edge_positions(indptr, indices, torch.zeros(n, dtype=torch.int64), fanout, gen(11))
    pairs = np.sort(eid.numpy().reshape(n, fanout), axis=1)
    subsets = list(combinations(range(deg), fanout))
    index = {s: i for i, s in enumerate(subsets)}
    counts = np.bincount([index[tuple(p)] for p in pairs], minlength=len(subsets))
    exp = n / len(subsets)
    stat = ((counts - exp) ** 2 / exp).sum()
    assert chi2.sf(stat, len(subsets) - 1) > 1e-3, counts


def test_sampling_is_seeded_and_handles_empty_input():
    indptr, indices = random_csr(50, 400, seed=1)
    s = torch.arange(50)
    a = sample_neighbors(indptr, indices, s, 4, gen(5))
    b = sample_neighbors(indptr, indices, s, 4, gen(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    ptr, nbr = sample_neighbors(indptr, indices, torch.zeros(0, dtype=torch.int64), 4, gen())
    assert ptr.tolist() == [0] and nbr.numel() == 0
    ptr, nbr = sample_neighbors(np.array([0, 0, 0]), np.zeros(0, np.int64), torch.tensor([0, 1]), 3, gen())
    assert ptr.tolist() == [0, 0, 0] and nbr.numel() == 0


def test_a_block_names_every_tensor_it_holds():
    """The prefetching loader keeps a batch's memory alive for the stream that reads it through
    Block.tensors(): a tensor field it leaves out would be reused while still being read."""
    import dataclasses

    t = lambda n: torch.arange(n)  # noqa: E731
    blk = Block(t(4), t(5), 6, 3, _row=t(5), src_degree=t(6))
    held = {id(x) for x in blk.tensors()}
    tensor_fields = [f.name for f in dataclasses.fields(Block) if isinstance(getattr(blk, f.name), torch.Tensor)]
    assert len(tensor_fields) == 4
    assert all(id(getattr(blk, name)) in held for name in tensor_fields)
    assert len(Block(t(4), t(5), 6, 3).tensors()) == 2


def test_sampling_bad_input():
    indptr, indices = random_csr(20, 100, seed=1)
    with pytest.raises(IndexError, match="out of range"):
        sample_neighbors(indptr, indices, torch.tensor([20]), 2, gen())
    with pytest.raises(IndexError, match="out of range"):
        sample_neighbors(indptr, indices, torch.tensor([-1]), 2, gen())
    with pytest.raises(TypeError, match="seeds"):
        sample_neighbors(indptr, indices, torch.tensor([1.0]), 2, gen())
    for bad in (0, -2):
        with pytest.raises(ValueError, match="positive integer or -1"):
            sample_neighbors(indptr, indices, torch.tensor([1]), bad, gen())


def test_check_fanouts():
    assert check_fanouts([25, 10]) == [25, 10]
    assert check_fanouts(5) == [5]
    assert check_fanouts([-1, 3]) == [-1, 3]
    with pytest.raises(ValueError, match="at least one"):
        check_fanouts([])
    with pytest.raises(ValueError, match=r"fanouts\[1\] must be a positive integer or -1.*got 0"):
        check_fanouts([5, 0])
    with pytest.raises(ValueError, match=r"fanouts\[0\] must be an integer"):
        check_fanouts([2.5])
    with pytest.raises(ValueError, match="must be an integer"):
        check_fanouts([True])


# -- Fused-Map -----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30, unique=True), st.lists(st.integers(0, 60), max_size=200))
def test_fused_map_round_trip(seeds, rest):
    ids = torch.tensor(seeds + rest, dtype=torch.int64)
    n_id, local = fused_map(ids, len(seeds))
    assert torch.equal(n_id[local], ids)                       # round trip
    assert n_id[: len(seeds)].tolist() == seeds                # seeds first, in order
    assert len(set(n_id.tolist())) == n_id.numel() == len(set(seeds + rest))  # deduplicated
    # the others in first-occurrence order
    first = {}
    for v in seeds + rest:
        first.setdefault(v, len(first))
    assert n_id.tolist() == sorted(first, key=first.get)
    n2, l2 = unique_map(ids, len(seeds))
    assert torch.equal(n_id, n2) and torch.equal(local, l2)   # same as the sort-chain baseline


def test_fused_map_large_and_hash_table():
    g = gen(3)
    seeds = torch.randperm(100000, generator=g)[:3000]
    ids = torch.cat([seeds, torch.randint(0, 100000, (200000,), generator=g), seeds[:10]])
    n_id, local = fused_map(ids, 3000)
    n2, l2 = unique_map(ids, 3000)
    assert set(n_id.tolist()) == set(n2.tolist()) and torch.equal(n_id, n2) and torch.equal(local, l2)
    table_key, table_min, slot = hash_insert(ids.numpy())
    assert (table_key[slot] == ids.numpy()).all()
    assert (table_key >= 0).sum() == n_id.numel()
    assert (ids.numpy()[table_min[slot]] == ids.numpy()).all()


def test_build_id_map_and_errors():
    m = build_id_map(torch.tensor([5, 2]), [torch.tensor([2, 7]), torch.tensor([9, 5, 7])])
    assert m.n_id.tolist() == [5, 2, 7, 9] and m.n_seeds == 2 and m.num_nodes == 4
    assert [t.tolist() for t in m.local] == [[1, 2], [3, 0, 2]]
    m2 = build_id_map(torch.tensor([5, 2]), [torch.tensor([2, 7]), torch.tensor([9, 5, 7])], method="unique")
    assert torch.equal(m.n_id, m2.n_id)
    with pytest.raises(ValueError, match="seeds must be unique"):
        fused_map(torch.tensor([3, 3, 4]), 2)
    with pytest.raises(ValueError, match="seeds must be unique"):
        unique_map(torch.tensor([3, 3, 4]), 2)
    with pytest.raises(ValueError, match="non-negative"):
        fused_map(torch.tensor([1, -4]), 1)
    with pytest.raises(TypeError, match="int64"):
        fused_map(torch.tensor([1.0]), 1)
    with pytest.raises(ValueError, match="method"):
        build_id_map(torch.tensor([1]), [], method="sort")
    n_id, local = fused_map(torch.zeros(0, dtype=torch.int64), 0)
    assert n_id.numel() == 0 and local.numel() == 0


# -- feature sources -----------------------------------------------------------------------------
def test_feature_sources_gather_source_rows():
    x = np.random.default_rng(0).standard_normal((57, 6)).astype(np.float32)
    comm = Communicator(comm=None)
    ids = torch.tensor([3, 56, 0, 3, 20])
    store = LocalStore(comm)
    sources = [TensorFeatures(x), StoreFeatures.from_global(store, partition_ranges(np.arange(58), 1), x),
               HostTierFeatures(x, comm)]
    for src in sources:
        out = src.gather(ids)
        assert out.dtype == torch.float32 and torch.equal(out, torch.from_numpy(x[ids.numpy()])), src.tier
        assert src.last.rows == 5 and src.stats.bytes == 5 * 6 * 4
        assert src.gather(torch.zeros(0, dtype=torch.int64)).shape == (0, 6)
        with pytest.raises(IndexError, match="out of range"):
            src.gather(torch.tensor([57]))
        assert torch.equal(src.gather(ids, checked=True), out) and src.last.rows == 5  # the range not read
        src.close()
    assert sources[2].tier == "host" and sources[1].tier == "store"


def test_the_loader_gathers_its_own_ids_without_a_range_check(monkeypatch):
    """The loader's ids are in range by construction (seeds checked when it is built, neighbors
    from the loaded CSR): its gathers pass checked=True, so no range read (a GPU synchronisation)."""
    indptr, indices = random_csr(300, 2400, seed=2)
    x = np.random.default_rng(1).standard_normal((300, 5)).astype(np.float32)
    for reuse in (False, True):
        loader = NeighborLoader((indptr, indices), x, np.zeros(300, np.int64), np.arange(0, 300, 3), [4, 3],
                                batch_size=25, reuse=reuse)

        def refuse(lo, hi):
            raise AssertionError("the loader's gather read the ids' range")

        monkeypatch.setattr(loader.features, "_check_range", refuse)
        for batch in loader:
            assert torch.equal(batch.x, torch.from_numpy(x[batch.n_id.numpy()]))


def test_a_loader_with_index_features_gives_the_tables_rows_by_id():
    """index_features: batch.x is IndexedRows(table, n_id) over a one-table source (in memory, or
    the store of one rank) -- nothing gathered, the same rows --; with reuse, or a source of
    several tables, the gathered rows."""
    from mgg.nn import IndexedRows

    indptr, indices = random_csr(300, 2400, seed=2)
    x = np.random.default_rng(1).standard_normal((300, 5)).astype(np.float32)
    store = LocalStore(Communicator(comm=None))
    feats = StoreFeatures.from_global(store, partition_ranges(indptr, 1), x)
    for source in (x, feats):
        for reuse in (False, True):
            loader = NeighborLoader((indptr, indices), source, np.zeros(300, np.int64), np.arange(0, 300, 3),
                                    [4, 3], batch_size=25, reuse=reuse, index_features=True)
            for batch in loader:
                assert isinstance(batch.x, IndexedRows) != reuse
                got = batch.x.materialize() if isinstance(batch.x, IndexedRows) else batch.x
                assert torch.equal(got, torch.from_numpy(x[batch.n_id.numpy()]))
            assert loader.stats.rows_fetched + loader.stats.rows_reused == loader.stats.nodes
    feats.close()


def test_feature_budget_choice_and_sizes():
    assert parse_size("8G") == 8 << 30 and parse_size("512M") == 512 << 20 and parse_size("64k") == 64 << 10
    assert parse_size("1.5K") == 1536 and parse_size("0") == 0 and parse_size("2GiB") == 2 << 30
    assert parse_size("100B") == 100 and parse_size(7) == 7
    for bad in ("", "G", "-1", "5Q", "1e9"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    # 1000 nodes x 16 floats over 2 ranks: a 32000-byte slice
    assert choose_feature_source(1000, 16, 0, world_size=2) == "store"        # 0 = unlimited
    assert choose_feature_source(1000, 16, 32000, world_size=2) == "store"
    assert choose_feature_source(1000, 16, 31999, world_size=2) == "host"
    assert choose_feature_source(1000, 16, 40000, rows_per_pe=700) == "host"
    with pytest.raises(ValueError):
        choose_feature_source(10, 2, -1)
    x = np.ones((10, 4), np.float32)
    comm = Communicator(comm=None)
    b = np.array([0, 10])
    assert make_feature_source(x, LocalStore(comm), b, comm, budget_bytes=100).tier == "host"
    assert make_feature_source(x, LocalStore(comm), b, comm, budget_bytes=160).tier == "store"


# -- Match-Reorder and resident reuse -----------------------------------------------------------------
def test_overlap_matrix_matches_sets():
    rng = np.random.default_rng(0)
    sets = [np.unique(rng.integers(0, 50, rng.integers(0, 30))) for _ in range(7)]
    o = overlap_matrix(sets, 50)
    for i in range(7):
        for j in range(7):
            assert o[i, j] == len(np.intersect1d(sets[i], sets[j]))
    assert fetch_cost(o, [0, 1]) == len(sets[0]) + len(sets[1]) - o[0, 1]


@pytest.mark.parametrize("chunk_elems", [1 << 26, 7 * 13, 7])  # one chunk, several, one id per chunk
def test_overlap_matrix_torch_equals_brute_force(chunk_elems):
    rng = np.random.default_rng(3)
    sets = [np.unique(rng.integers(0, 90, rng.integers(0, 60))) for _ in range(7)] + [np.zeros(0, np.int64)]
    ref = np.array([[len(np.intersect1d(a, b)) for b in sets] for a in sets])
    o = overlap_matrix_torch([torch.from_numpy(s) for s in sets], 90, chunk_elems=chunk_elems)
    assert o.dtype == torch.int64 and np.array_equal(o.numpy(), ref)
    assert np.array_equal(overlap_matrix_torch([torch.from_numpy(s) for s in sets]).numpy(), ref)  # n inferred
    assert overlap_matrix_torch([]).shape == (0, 0)


def test_match_reorder_is_a_permutation_and_fetches_less_on_a_clustered_graph():
    indptr, indices = block_graph(parts=8, size=40)
    n = len(indptr) - 1
    cluster = np.arange(n) // 40
    rng = np.random.default_rng(1)
    # two batches per cluster, in shuffled order: consecutive batches rarely share a cluster
    batches = [torch.from_numpy(rng.choice(np.flatnonzero(cluster == c), 8, replace=False))
               for c in rng.permutation(np.repeat(np.arange(8), 2))]
    sets = [sample_blocks(indptr, indices, b, [3, 3], gen(i))[0] for i, b in enumerate(batches)]
    o = overlap_matrix(sets, n)
    for metric in ("intersection", "jaccard"):
        order = match_reorder(sets, metric, overlap=o)
        assert sorted(order) == list(range(len(sets))) and order[0] == 0
        assert fetch_cost(o, order) <= fetch_cost(o, range(len(sets)))
    order = match_reorder(sets)
    assert fetch_cost(o, order) < 0.8 * fetch_cost(o, range(len(sets)))  # the point of reordering
    assert match_reorder([]) == []
    with pytest.raises(ValueError, match="metric"):
        match_reorder(sets, "cosine")


def test_resident_cache_reuses_previous_rows():
    x = np.random.default_rng(2).standard_normal((30, 3)).astype(np.float32)
    src = TensorFeatures(x)
    cache = ResidentCache()
    a, b = torch.tensor([4, 9, 1, 20]), torch.tensor([9, 2, 20, 29, 4])
    assert torch.equal(cache.gather(a, src), torch.from_numpy(x[a.numpy()]))
    assert (cache.last_fetched, cache.last_reused) == (4, 0)
    assert torch.equal(cache.gather(b, src), torch.from_numpy(x[b.numpy()]))
    assert (cache.last_fetched, cache.last_reused) == (2, 3)       # 9, 20, 4 were resident
    assert src.last.rows == 2 and src.stats.rows == 6               # only the misses were read
    assert torch.equal(cache.gather(b, src), torch.from_numpy(x[b.numpy()]))
    assert (cache.last_fetched, cache.last_reused) == (0, 5)
    assert cache.gather(torch.zeros(0, dtype=torch.int64), src).shape == (0, 3)
    assert (cache.total_fetched, cache.total_reused) == (6, 8)


# -- the loader ------------------------------------------------------------------------------------
def make_loader(fanouts=(4, 3), batch_size=16, **kw):
    indptr, indices = random_csr(120, 1500, seed=4)
    x = np.random.default_rng(0).standard_normal((120, 5)).astype(np.float32)
    y = np.arange(120) % 3
    seeds = np.arange(0, 120, 2)
    return NeighborLoader((indptr, indices), TensorFeatures(x), y, seeds, list(fanouts), batch_size, **kw), \
        (indptr, indices, x, y, seeds)


@pytest.mark.parametrize("reorder", [False, True])
def test_loader_batches_are_valid(reorder):
    fanouts = [4, 3]
    loader, (indptr, indices, x, y, seeds) = make_loader(fanouts, 16, reorder=reorder)
    adj = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(120, 120))
    assert len(loader) == 4  # ceil(60 / 16)
    seen = []
    for batch in loader:
        n_id = batch.n_id.numpy()
        assert len(np.unique(n_id)) == len(n_id)
        assert torch.equal(batch.seeds, batch.n_id[: batch.batch_size])
        assert torch.equal(batch.x, torch.from_numpy(x[n_id]))
        assert torch.equal(batch.y, torch.from_numpy(y[batch.seeds.numpy()]))
        assert len(batch.blocks) == 2 and batch.blocks[0].n_src == len(n_id)
        assert batch.blocks[-1].n_dst == batch.batch_size
        assert batch.blocks[0].n_dst == batch.blocks[1].n_src
        for block, f in zip(batch.blocks, reversed(fanouts)):  # input layer first: fanouts[-1]
            assert block.col.max() < block.n_src and (block.deg <= f).all()
            dst, src = n_id[block.row.numpy()], n_id[block.col.numpy()]
            assert (np.asarray(adj[dst, src]).ravel() > 0).all()   # every block edge is a graph edge
            assert np.array_equal(block.deg.numpy(), np.minimum(np.diff(indptr)[n_id[: block.n_dst]], f))
        assert batch.rows_fetched + batch.rows_reused == len(n_id)
        seen.append(batch.seeds.numpy())
    assert np.array_equal(np.sort(np.concatenate(seen)), seeds)  # every seed once per epoch
    st = loader.stats
    assert st.steps == 4 and st.seeds == 60 and st.rows_fetched + st.rows_reused == st.nodes
    assert st.bytes_fetched == st.rows_fetched * 20 and st.bytes_no_reuse == st.nodes * 20
    assert (st.bytes_identity_order is not None) == reorder


@pytest.mark.slow
def test_loader_reorder_uses_the_same_batches_and_reports_both_costs():
    a, _ = make_loader(reorder=False, seed=3)
    b, _ = make_loader(reorder=True, seed=3)
    for _ in range(2):
        ids_a = sorted(tuple(t.n_id.tolist()) for t in a)
        ids_b = sorted(tuple(t.n_id.tolist()) for t in b)
        assert ids_a == ids_b                                   # same samples, other order
        assert b.stats.bytes_identity_order == a.stats.bytes_fetched
        assert b.stats.bytes_fetched <= a.stats.bytes_fetched
        assert sorted(b.stats.order) == list(range(len(b)))
    c, _ = make_loader(reorder=False, seed=3, reuse=False)
    list(c)
    assert c.stats.rows_reused == 0 and c.stats.bytes_fetched == c.stats.bytes_no_reuse


def test_loader_epochs_shuffle_deterministically():
    a, _ = make_loader(seed=1)
    b, _ = make_loader(seed=1)
    e1 = [t.seeds.tolist() for t in a]
    assert e1 == [t.seeds.tolist() for t in b]
    assert e1 != [t.seeds.tolist() for t in a]              # next epoch: another shuffle
    c, _ = make_loader(seed=1, shuffle=False)
    assert [t.seeds.tolist() for t in c][0] == list(range(0, 30, 2))  # 4 batches of 15


def test_loader_prefetch_is_cuda_only():
    """The CPU loader never prefetches (nothing to overlap with); asking for it changes nothing."""
    a, _ = make_loader(seed=2, prefetch=True)
    b, _ = make_loader(seed=2, prefetch=False)
    assert a.prefetch is False and b.prefetch is False
    for ta, tb in zip(a, b):
        assert torch.equal(ta.n_id, tb.n_id) and torch.equal(ta.x, tb.x)


def test_loader_step_counts_and_drop_last():
    a, _ = make_loader(batch_size=50)
    assert len(a) == 2 and [t.batch_size for t in a] == [30, 30]   # balanced batches <= batch_size
    b, _ = make_loader(batch_size=50, drop_last=True)
    assert len(b) == 1 and [t.batch_size for t in b] == [50]
    c, _ = make_loader(batch_size=1000)
    assert len(c) == 1
    with pytest.raises(ValueError, match="drop_last"):
        make_loader(batch_size=61, drop_last=True)


def test_loader_empty_seeds_yield_empty_batches():
    indptr, indices = random_csr(30, 100, seed=1)
    loader = NeighborLoader((indptr, indices), TensorFeatures(np.ones((30, 2), np.float32)), np.zeros(30, np.int64),
                            np.zeros(0, np.int64), [3], 4)
    assert len(loader) == 0 and list(loader) == []
    n_id, blocks = sample_blocks(indptr, indices, torch.zeros(0, dtype=torch.int64), [3, 2], gen())
    model = SampledSAGE(2, 4, 3, 2)
    out = model(torch.zeros(0, 2), blocks)
    assert out.shape == (0, 3)
    torch.nn.functional.cross_entropy(out, torch.zeros(0, dtype=torch.int64), reduction="sum").backward()


@pytest.mark.parametrize("kw,msg", [
    ({"fanouts": []}, "fanouts must hold at least one"),
    ({"fanouts": [5, 0]}, r"fanouts\[1\] must be a positive integer or -1"),
    ({"fanouts": [-3]}, r"fanouts\[0\] must be a positive integer or -1"),
    ({"fanouts": [2.5]}, r"fanouts\[0\] must be an integer"),
    ({"fanouts": "25,10"}, r"fanouts\[0\] must be an integer"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
    ({"batch_size": -4}, "batch_size must be an integer >= 1"),
    ({"batch_size": 2.0}, "batch_size must be an integer >= 1"),
    ({"batch_size": True}, "batch_size must be an integer >= 1"),
    ({"seeds": [0, 120]}, r"seeds out of range \[0, 120\): found 120"),
    ({"seeds": [-1]}, "seeds out of range"),
    ({"seeds": [0.5]}, "seeds must be integer node ids"),
    ({"seeds": np.array([1.0, 2.0])}, "seeds must be integer node ids, got dtype float64"),
    ({"seeds": np.ones(120, bool)}, "boolean"),
    ({"seeds": [[1, 2]]}, "seeds must be a 1-D"),
    ({"seeds": [3, 3]}, "seeds must be unique"),
    ({"labels": np.zeros(5)}, r"labels must have shape \(120,\)"),
    ({"labels": None}, "labels must be"),
    ({"features": np.ones((7, 2), np.float32)}, "features cover 7 nodes"),
    ({"id_map": "sort"}, "id_map"),
    ({"seed": -1}, "seed must be"),
    ({"reorder_metric": "x"}, "reorder_metric"),
])
def test_loader_bad_arguments(kw, msg):
    indptr, indices = random_csr(120, 500, seed=1)
    args = {"graph_csr": (indptr, indices), "features": np.ones((120, 2), np.float32),
            "labels": np.zeros(120, np.int64), "seeds": np.arange(10), "fanouts": [3, 2], "batch_size": 4}
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        NeighborLoader(**args)


# -- the block model --------------------------------------------------------------------------------
def test_sage_block_conv_with_all_neighbors_equals_full_graph_sage():
    """fanout -1 blocks over all nodes == the full-graph SAGE on the DistGraph (same weights)."""
    indptr, indices = random_csr(60, 400, seed=2)
    x = torch.randn(60, 7)
    model = SampledSAGE(7, 16, 4, layers=2, dropout=0.5).eval()
    n_id, blocks = sample_blocks(indptr, indices, torch.arange(60), [-1, -1], gen())
    assert torch.equal(n_id, torch.arange(60))
    out = model(x, blocks)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(backend="cpu"))
    full = model.to_full_graph()
    assert isinstance(full, SAGE) and not full.training
    assert torch.allclose(out, full(x, dg, None), atol=1e-5)
    dg.close()


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_sage_block_conv_dense_and_grad(fin, fout):
    indptr, indices = random_csr(40, 200, seed=6)
    seeds = torch.tensor([3, 7, 0, 22, 39])
    n_id, (block,) = sample_blocks(indptr, indices, seeds, [4], gen(2))
    conv = SAGEBlockConv(fin, fout)
    h = torch.randn(block.n_src, fin, dtype=torch.float64, requires_grad=True)
    conv = conv.double()
    a = np.zeros((block.n_dst, block.n_src))
    np.add.at(a, (block.row.numpy(), block.col.numpy()), 1.0)
    a /= np.maximum(a.sum(1, keepdims=True), 1)
    ref = torch.from_numpy(a) @ h @ conv.lin_l.weight.T + conv.lin_l.bias + h[: block.n_dst] @ conv.lin_r.weight.T
    assert torch.allclose(conv(h, block), ref, atol=1e-10)
    assert torch.autograd.gradcheck(lambda t: conv(t, block), (h,), eps=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="src nodes"):
        conv(h[:-1], block)


def test_block_checks_its_shape():
    with pytest.raises(ValueError, match="ptr"):
        Block(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 4, 3)
    with pytest.raises(ValueError, match="prefix"):
        Block(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, 3)


@pytest.mark.slow
def test_sampled_sage_learns_clusters():
    """A few epochs on the clustered graph: the loss goes down (labels = cluster)."""
    indptr, indices = block_graph(parts=4, size=30, seed=2)
    n = len(indptr) - 1
    y = np.arange(n) // 30
    x = (np.eye(4)[y] + np.random.default_rng(0).normal(0, 2.0, (n, 4))).astype(np.float32)
    loader = NeighborLoader((indptr, indices), x, y, np.arange(n), [5, 5], 32, seed=0)
    torch.manual_seed(0)
    model = SampledSAGE(4, 16, 4, 2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(8):
        tot = 0.0
        for batch in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch.x, batch.blocks), batch.y, reduction="sum") / n
            loss.backward()
            opt.step()
            tot += loss.item()
        losses.append(tot)
    assert losses[-1] < 0.5 * losses[0]
    assert aggregation_matrix is not None
