"""mgg.embedding.grad_exchange.DeviceGradExchange's own logic on the CPU: P PEs as threads over a
stand-in for nvshmem.core (symmetric tensors as plain tensors, a barrier and all-to-alls that move
the regions between the PEs' buffers) and a store whose all-reduce and quiesce meet the other
threads. Both paths -- per call (capacity grown on demand) and fixed-shape (reserved once) --
give every owner the float64 sums of the rows sent to it; the buffers are replaced, not leaked.
The real NVSHMEM path runs in the GPU tests."""
import sys
import threading
import types

import numpy as np
import pytest
import torch

from mgg.embedding.grad_exchange import MIN_CAPACITY, DeviceGradExchange


class _World:
    """What P threads share: a barrier, the all-reduce slots and the send buffers by PE."""

    def __init__(self, size: int):
        self.size, self.barrier = size, threading.Barrier(size)
        self.values: dict = {}
        self.sends: dict = {}
        self.live, self.freed = 0, 0
        self.lock = threading.Lock()
        self.rank_of = threading.local()


def _fake_nvshmem(w: _World) -> types.ModuleType:
    core = types.ModuleType("nvshmem.core")

    def tensor(shape, dtype):
        with w.lock:
            w.live += 1
        return torch.zeros(shape, dtype=dtype)

    def free_tensor(t):
        with w.lock:
            w.freed += 1

    def barrier_all(stream=None):
        w.barrier.wait()

    def alltoall(team, dst, src, stream=None):
        """Region r of PE q's src lands in region q of PE r's dst (equal regions)."""
        me = w.rank_of.value
        w.sends[me] = src
        w.barrier.wait()
        n = src.shape[0] // w.size
        for q in range(w.size):
            dst[q * n:(q + 1) * n] = w.sends[q][me * n:(me + 1) * n]
        w.barrier.wait()

    core.tensor, core.free_tensor, core.barrier_all, core.alltoall = tensor, free_tensor, barrier_all, alltoall
    core.Teams = types.SimpleNamespace(TEAM_WORLD=0)
    pkg = types.ModuleType("nvshmem")
    pkg.core = core
    return pkg


class _Comm:
    def __init__(self, w: _World):
        self.w = w

    def allreduce_scalar(self, value, op="sum"):
        w, me = self.w, self.w.rank_of.value
        w.values[me] = value
        w.barrier.wait()
        out = max(w.values.values()) if op == "max" else sum(w.values.values())
        w.barrier.wait()
        return out


class _Store:
    def __init__(self, w: _World):
        self.comm, self.w = _Comm(w), w

    def quiesce(self):
        self.w.barrier.wait()


@pytest.fixture
def fake_device(monkeypatch):
    holder = {}

    def install(w: _World):
        pkg = _fake_nvshmem(w)
        monkeypatch.setitem(sys.modules, "nvshmem", pkg)
        monkeypatch.setitem(sys.modules, "nvshmem.core", pkg.core)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: types.SimpleNamespace(cuda_stream=0))
    holder["install"] = install
    return holder


def _slots(rank: int, world: int, n: int, rows: int):
    """PE `rank`'s slots of one forward: owner (-1 unused), local rows unique per owner, values."""
    rng = np.random.default_rng(100 * world + rank)
    owner = torch.from_numpy(rng.integers(-1, world, n)).to(torch.int32)
    local = torch.from_numpy(rng.integers(0, rows, n))
    for q in range(world):
        m = torch.from_numpy((owner == q).numpy())
        local[m] = torch.from_numpy(rng.permutation(rows)[: int(m.sum())])
    return owner, local, torch.from_numpy(rng.standard_normal((n, 3))).float()


def _want(world: int, n: int, rows: int):
    """float64 sums by (owner, row) over every PE's valid slots."""
    want = [dict() for _ in range(world)]
    for r in range(world):
        owner, local, vals = _slots(r, world, n, rows)
        for o, loc, v in zip(owner.tolist(), local.tolist(), vals.double().numpy()):
            if o >= 0:
                want[o][loc] = want[o].get(loc, 0.0) + v
    return want


def _run(world: int, fn, fake_device):
    """fn(rank, exchange) on `world` threads over the stand-in nvshmem.core; their results by rank
    and the world (an exception in a thread is re-raised)."""
    w = _World(world)
    fake_device["install"](w)
    out, errors = [None] * world, []
    store = _Store(w)

    def body(rank):
        w.rank_of.value = rank
        try:
            out[rank] = fn(rank, DeviceGradExchange(store, world, 3, torch.float32))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            w.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, w


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("fixed", [False, True])
def test_every_owner_gets_the_sums_of_its_rows(fake_device, world, fixed):
    n, rows = 70, 50

    def fn(rank, ex):
        owner, local, vals = _slots(rank, world, n, rows)
        if fixed:
            cap = ex.reserve_fixed(n + 1)
            assert cap == ex.fixed_capacity >= n + 1 and cap >= MIN_CAPACITY
            assert ex.reserve_fixed(n + 1) == cap  # kept: not replaced
            got_rows, sums = ex.exchange_fixed(owner, local, vals)
            keep = got_rows >= 0
            got_rows, sums = got_rows[keep], sums[keep]
        else:
            got_rows, sums = ex.exchange(owner, local, vals)
            assert ex.capacity >= MIN_CAPACITY
        ex.free()
        return got_rows, sums

    out, w = _run(world, fn, fake_device)
    want = _want(world, n, rows)
    for q in range(world):
        got_rows, sums = out[q]
        assert sorted(got_rows.tolist()) == sorted(want[q])
        for r, s in zip(got_rows.tolist(), sums.double().numpy()):
            np.testing.assert_allclose(s, want[q][r], rtol=1e-5, atol=1e-6)
    assert w.live == w.freed  # every buffer allocated was freed


def test_a_larger_call_replaces_the_buffers(fake_device):
    """The per-call path grows its capacity when a call sends more than it holds (the old buffers
    freed, collectively) and still sums right; the fixed path refuses a call above its reserve."""
    world, rows = 2, 3000

    def fn(rank, ex):
        for n in (70, 4000):  # about 1,333 slots an owner: above the first capacity (1024)
            owner, local, vals = _slots(rank, world, n, rows)
            got_rows, sums = ex.exchange(owner, local, vals)
        caps = ex.capacity
        ex.reserve_fixed(10)
        with pytest.raises(RuntimeError, match="call reserve_fixed first"):
            ex.exchange_fixed(*_slots(rank, world, 5000, rows))
        ex.free()
        return got_rows, sums, caps

    out, w = _run(world, fn, fake_device)
    want = _want(world, 4000, rows)
    for q in range(world):
        got_rows, sums, caps = out[q]
        assert caps > MIN_CAPACITY and sorted(got_rows.tolist()) == sorted(want[q])
        np.testing.assert_allclose(sums.double().numpy(), np.stack([want[q][r] for r in got_rows.tolist()]),
                                   rtol=1e-5, atol=1e-6)
    assert w.live == w.freed
