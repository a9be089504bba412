"""mgg.embedding.grad_exchange's device-independent parts (the GPU store's gradient path): the
owner layout, the owner's deterministic sum, and P ranks' exchange simulated by moving the
regions, against a float64 numpy reference."""
import numpy as np
import pytest
import torch

from mgg.embedding.grad_exchange import pack_by_owner, sum_received, sum_received_fixed


def _slots(rng, n, world, rows, d, dtype=torch.float32):
    owner = torch.from_numpy(rng.integers(-1, world, n)).to(torch.int32)  # -1: unused slots
    local = torch.from_numpy(rng.integers(0, rows, n))
    vals = torch.from_numpy(rng.standard_normal((n, d))).to(dtype)
    return owner, local, vals


def test_pack_puts_each_owners_slots_in_its_region_in_input_order():
    rng = np.random.default_rng(0)
    world, cap = 3, 64
    owner, local, vals = _slots(rng, 100, world, 50, 5)
    rows, packed = pack_by_owner(owner, local, vals, world, cap)
    assert rows.shape == (world * cap,) and packed.shape == (world * cap, 5)
    for q in range(world):
        idx = np.flatnonzero(owner.numpy() == q)
        k = len(idx)
        assert k <= cap
        np.testing.assert_array_equal(rows[q * cap: q * cap + k].numpy(), local.numpy()[idx])
        np.testing.assert_array_equal(packed[q * cap: q * cap + k].numpy(), vals.numpy()[idx])
        assert (rows[q * cap + k: (q + 1) * cap] == -1).all()
        assert (packed[q * cap + k: (q + 1) * cap] == 0).all()


def test_pack_of_nothing_is_all_unused():
    rows, vals = pack_by_owner(torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int64),
                               torch.zeros((0, 4)), 2, 8)
    assert (rows == -1).all() and (vals == 0).all() and vals.shape == (16, 4)
    rows, vals = pack_by_owner(torch.full((5,), -1, dtype=torch.int32), torch.arange(5), torch.ones(5, 4), 2, 8)
    assert (rows == -1).all() and (vals == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_received_adds_each_rows_entries(dtype):
    rng = np.random.default_rng(1)
    m, d = 400, 7
    rows = torch.from_numpy(rng.integers(-1, 60, m))
    vals = torch.from_numpy(rng.standard_normal((m, d))).to(dtype)
    uniq, sums = sum_received(rows, vals)
    r = rows.numpy()
    want_rows = np.unique(r[r >= 0])
    ref = np.zeros((want_rows.max() + 1, d))
    np.add.at(ref, r[r >= 0], vals.numpy()[r >= 0].astype(np.float64))
    np.testing.assert_array_equal(uniq.numpy(), want_rows)
    assert sums.dtype == dtype
    np.testing.assert_allclose(sums.numpy(), ref[want_rows], rtol=1e-5, atol=1e-5)
    again = sum_received(rows.clone(), vals.clone())[1]
    assert torch.equal(again, sums)  # the same order every time: bit for bit


def test_sum_received_of_nothing():
    uniq, sums = sum_received(torch.full((6,), -1), torch.ones(6, 3))
    assert uniq.numel() == 0 and sums.shape == (0, 3)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_simulated_exchange_gives_each_owner_the_sum_of_its_rows(world):
    """P ranks' slots packed, region q of rank r moved to region r of rank q (what the all-to-alls
    do), summed at the owner: every owner's rows and sums equal the float64 reference."""
    rng = np.random.default_rng(2 + world)
    rows_per_pe, d = 40, 6
    sent = [_slots(rng, int(rng.integers(0, 90)), world, rows_per_pe, d) for _ in range(world)]
    cap = max(1, max(int((o == q).sum()) for o, _, _ in sent for q in range(world)))
    packed = [pack_by_owner(o, loc, v, world, cap) for o, loc, v in sent]
    for q in range(world):
        recv_rows = torch.cat([packed[r][0][q * cap:(q + 1) * cap] for r in range(world)])
        recv_vals = torch.cat([packed[r][1][q * cap:(q + 1) * cap] for r in range(world)])
        uniq, sums = sum_received(recv_rows, recv_vals)
        ref = np.zeros((rows_per_pe, d))
        for o, loc, v in sent:
            m = o.numpy() == q
            np.add.at(ref, loc.numpy()[m], v.numpy()[m].astype(np.float64))
        hit = np.unique(np.concatenate([loc.numpy()[o.numpy() == q] for o, loc, _ in sent]))
        np.testing.assert_array_equal(uniq.numpy(), hit)
        np.testing.assert_allclose(sums.numpy(), ref[hit], rtol=1e-5, atol=1e-5)


def _pack_with_bincount(owner, local, values, world, capacity):
    """pack_by_owner as it was written with torch.bincount (the reference of its replacement)."""
    n, d = int(owner.numel()), int(values.shape[1])
    m = world * capacity
    rows = torch.full((m + 1,), -1, dtype=torch.int64)
    vals = torch.zeros((m + 1, d), dtype=values.dtype)
    if n:
        own = owner.to(torch.int64)
        key = torch.where(own >= 0, own, torch.full_like(own, world))
        order = torch.sort(key, stable=True).indices
        sk = key[order]
        counts = torch.bincount(sk, minlength=world + 1)
        pos = torch.arange(n) - (torch.cumsum(counts, 0) - counts)[sk]
        slot = torch.where(sk < world, sk * capacity + pos, torch.full_like(sk, m))
        rows[slot] = local.to(torch.int64)[order]
        vals[slot] = values[order]
    return rows[:m], vals[:m]


@pytest.mark.parametrize("world", [1, 3])
def test_pack_without_bincount_is_the_bincount_pack(world):
    rng = np.random.default_rng(10 + world)
    for n in (0, 1, 57, 200):
        owner, local, vals = _slots(rng, n, world, 40, 3)
        got = pack_by_owner(owner, local, vals, world, 256)
        want = _pack_with_bincount(owner, local, vals, world, 256)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _at_most(rng, world, rows, unused, d, dtype=torch.float32):
    """Received rows where a row occurs at most `world` times (one forward a PE), -1 between."""
    r = np.concatenate([np.full(int(rng.integers(0, world + 1)), i) for i in range(rows)] + [np.full(unused, -1)])
    rng.shuffle(r)
    return torch.from_numpy(r.astype(np.int64)), torch.from_numpy(rng.standard_normal((len(r), d))).to(dtype)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fixed_sum_is_sum_received_bit_for_bit(world, dtype):
    """The fixed shape: the distinct rows ascending then -1, their sums bitwise the segment sums
    (each row's entries added in input order), zeros after; the same bits on every call."""
    rng = np.random.default_rng(20 + world)
    rows, vals = _at_most(rng, world, 70, 25, 6, dtype)
    uniq, sums = sum_received(rows, vals)
    got_rows, got_sums = sum_received_fixed(rows, vals, world)
    k = int(uniq.numel())
    assert got_rows.shape == rows.shape and got_sums.shape == vals.shape and got_sums.dtype == dtype
    assert torch.equal(got_rows[:k], uniq) and (got_rows[k:] == -1).all()
    assert torch.equal(got_sums[:k], sums) and (got_sums[k:] == 0).all()
    again = sum_received_fixed(rows.clone(), vals.clone(), world)
    assert torch.equal(again[0], got_rows) and torch.equal(again[1], got_sums)


def test_fixed_sum_of_nothing():
    rows, sums = sum_received_fixed(torch.full((5,), -1), torch.ones(5, 3), 2)
    assert (rows == -1).all() and (sums == 0).all() and sums.shape == (5, 3)
    rows, sums = sum_received_fixed(torch.zeros(0, dtype=torch.int64), torch.zeros(0, 3), 2)
    assert rows.shape == (0,) and sums.shape == (0, 3)


@pytest.mark.parametrize("world", [2, 3])
def test_simulated_fixed_exchange_equals_the_per_call_one(world):
    """Every PE's slots of one forward (unique local rows per owner), packed at a reserved
    capacity above every count, moved as the all-to-alls move them, summed in the fixed shape:
    the rows and sums of the per-call path, bit for bit."""
    rng = np.random.default_rng(30 + world)
    rows_per_pe, d = 40, 5
    sent = []
    for _ in range(world):
        n = int(rng.integers(10, 60))
        owner = torch.from_numpy(rng.integers(-1, world, n)).to(torch.int32)
        local = torch.from_numpy(rng.integers(0, rows_per_pe, n))  # kept at the unused slots
        for q in range(world):  # unique keys: a PE sends a row at most once
            m = (owner == q).numpy()
            local[torch.from_numpy(m)] = torch.from_numpy(rng.permutation(rows_per_pe)[: int(m.sum())])
        sent.append((owner, local, torch.from_numpy(rng.standard_normal((n, d))).float()))
    cap = max(int(o.numel()) for o, _, _ in sent) + 1
    packed = [pack_by_owner(o, loc, v, world, cap) for o, loc, v in sent]
    for q in range(world):
        recv_rows = torch.cat([packed[r][0][q * cap:(q + 1) * cap] for r in range(world)])
        recv_vals = torch.cat([packed[r][1][q * cap:(q + 1) * cap] for r in range(world)])
        uniq, sums = sum_received(recv_rows, recv_vals)
        got_rows, got_sums = sum_received_fixed(recv_rows, recv_vals, world)
        k = int(uniq.numel())
        assert torch.equal(got_rows[:k], uniq) and (got_rows[k:] == -1).all()
        assert torch.equal(got_sums[:k], sums)
