"""mgg.embedding.train_lookup (the GPU store's training forward, all tables at once) on the CPU:
routed ids, unique slots and grouped pooling against torch's embedding_bag per table over the
whole tables in float64, forward and gradient, with P = 3 simulated owners."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mgg.embedding.device_input import DeviceBags
from mgg.embedding.sharding import TableLayout
from mgg.embedding.train_lookup import RouteCache, pool, route, unique_slots
from mgg.kernels.embedding_gpu import TableGeometry

P = 3
# (rows, dim, mode, sharding, per-sample weights, 2-D input)
TABLES = [(50, 4, "sum", "range", False, False), (37, 4, "sum", "hash", False, False),
          (20, 4, "sum", "range", True, False), (64, 6, "mean", "range", False, False),
          (9, 4, "max", "hash", False, True), (41, 4, "sum", "range", False, False)]


def _setup(include_last_offset=False, seed=0):
    rng = np.random.default_rng(seed)
    lay = TableLayout(tuple(t[0] for t in TABLES), tuple(t[3] for t in TABLES), P)
    geometry = [TableGeometry(n, lay.slice_rows(i), int(lay.base[i]), s == "hash", P, d, m)
                for i, (n, d, m, s, _, _) in enumerate(TABLES)]
    dmax = max(t[1] for t in TABLES)
    full = [torch.from_numpy(rng.standard_normal((n, d))) for n, d, *_ in TABLES]
    store = torch.zeros((P, lay.rows_per_pe, dmax), dtype=torch.float64)  # every PE's slice
    for i, w in enumerate(full):
        owner, local = lay.locate(i, np.arange(TABLES[i][0]))
        store[torch.from_numpy(owner), torch.from_numpy(local), : w.shape[1]] = w
    bags, refs = [], []
    for i, (n, d, mode, _, weighted, two_d) in enumerate(TABLES):
        if i == 5:  # a table absent from the call
            bags.append(None)
            refs.append((None, None, None))
            continue
        if two_d:
            ids = torch.from_numpy(rng.integers(0, n, (7, 3)))
            bags.append(DeviceBags(ids.reshape(-1), None, 7, 3, None, 0, 0, ()))
            refs.append((ids, None, None))
            continue
        k, nb = int(rng.integers(10, 40)), int(rng.integers(3, 9))
        ids = torch.from_numpy(rng.integers(0, n, k))
        off = torch.from_numpy(np.sort(rng.integers(0, k - 1, nb)))  # the last two ids: in no bag below
        off[0] = 0
        off[1] = 0  # an empty bag
        psw = torch.from_numpy(rng.random(k)) if weighted else None
        if include_last_offset:
            off = torch.cat([off, torch.tensor([k - 2])])  # the last two ids belong to no bag
        bags.append(DeviceBags(ids, off, nb, 0, psw, 0, 0, ()))
        refs.append((ids, off, psw))
    return lay, geometry, full, store, bags, refs


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_all_tables_at_once_equal_each_table_alone(include_last_offset):
    lay, geometry, full, store, bags, refs = _setup(include_last_offset)
    cache = RouteCache()
    key, owner, local, present = route(geometry, lay.table_offset, bags, cache, torch.device("cpu"))
    assert present == [0, 1, 2, 3, 4]
    inv, slot_key, slot_owner, slot_local = unique_slots(key, owner, local)
    valid = slot_owner >= 0
    assert int(valid.sum()) == len(torch.unique(key))  # one slot per distinct row
    rows = torch.zeros((len(slot_key), store.shape[2]), dtype=torch.float64)
    rows[valid] = store[slot_owner[valid].long(), slot_local[valid]]
    rows.requires_grad_()
    outs = pool(rows, inv, bags, geometry, present, include_last_offset, cache)
    assert outs[5] is None
    leaves = [w.clone().requires_grad_() for w in full]
    total, ref_total = 0.0, 0.0
    for i, (ids, off, psw) in enumerate(refs):
        if ids is None:
            continue
        mode = TABLES[i][2]
        last = include_last_offset and off is not None
        if last:  # mgg's rule: ids after offsets[-1] belong to no bag (torch would pool them into the last)
            ids, psw = ids[: int(off[-1])], None if psw is None else psw[: int(off[-1])]
        ref = F.embedding_bag(ids, leaves[i], off, mode=mode, per_sample_weights=psw, include_last_offset=last)
        np.testing.assert_allclose(outs[i].detach().numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-12)
        g = torch.from_numpy(np.random.default_rng(i).standard_normal(tuple(ref.shape)))
        total = total + (outs[i] * g).sum()
        ref_total = ref_total + (ref * g).sum()
    total.backward()
    ref_total.backward()
    # the slots' gradient, sent to (owner, local), equals each table's dense gradient
    got = torch.zeros_like(store)
    keep = slot_owner >= 0
    got.index_put_((slot_owner[keep].long(), slot_local[keep]), rows.grad[keep], accumulate=True)
    for i, w in enumerate(leaves):
        if w.grad is None:
            continue
        owner_i, local_i = lay.locate(i, np.arange(TABLES[i][0]))
        np.testing.assert_allclose(got[torch.from_numpy(owner_i), torch.from_numpy(local_i), : w.shape[1]].numpy(),
                                   w.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert int(slot_owner[len(key)]) == -1  # the sink slot (a zero row): its gradient goes nowhere


def test_bad_ids_are_clamped_into_the_table():
    lay, geometry, full, store, bags, refs = _setup()
    bags[0].ids[0] = -5
    bags[1].ids[0] = 10 ** 6
    key, owner, local, _ = route(geometry, lay.table_offset, bags, RouteCache(), torch.device("cpu"))
    assert int(key[0]) == lay.table_offset[0]  # row 0 of table 0
    k0 = int(bags[0].ids.numel())
    assert int(key[k0]) == lay.table_offset[1] + TABLES[1][0] - 1  # the last row of table 1
    assert ((owner >= 0) & (owner < P)).all() and ((local >= 0) & (local < lay.rows_per_pe)).all()


def test_the_route_cache_keeps_shape_vectors_bounded():
    c = RouteCache(max_entries=3)
    for i in range(7):
        c.get(("x", i), lambda: torch.zeros(1))
    assert len(c.tensors) <= 3


def test_a_call_without_ids_pools_empty_bags():
    lay, geometry, full, store, bags, refs = _setup()
    empty = [None if b is None else DeviceBags(b.ids[:0], torch.zeros(3, dtype=torch.int64) if b.offsets is not None
                                               else None, 3 if b.offsets is not None else 0, 0 if b.offsets is not None
                                               else b.bag_size, None if b.per_sample_weights is None
                                               else b.per_sample_weights[:0], 0, 0, ())
             for b in bags]
    cache = RouteCache()
    key, owner, local, present = route(geometry, lay.table_offset, empty, cache, torch.device("cpu"))
    assert key.numel() == 0
    inv, slot_key, slot_owner, slot_local = unique_slots(key, owner, local)
    rows = torch.zeros((1, store.shape[2]), dtype=torch.float64)
    outs = pool(rows, inv, empty, geometry, present, False, cache)
    for t in present:
        assert outs[t].shape == (empty[t].num_bags, TABLES[t][1]) and (outs[t] == 0).all()
