import threading
import time

import pytest

from mgg.runtime.watchdog import Watchdog


def test_fires_on_stuck_phase_with_rank_and_phase():
    seen = []
    done = threading.Event()
    wd = Watchdog(0.2, rank=3, on_timeout=lambda m: (seen.append(m), done.set()), poll_s=0.02)
    with wd.phase("allreduce"):
        assert done.wait(5)
    wd.close()
    assert "rank 3" in seen[0] and "allreduce" in seen[0] and "timeout 0.2" in seen[0]


def test_quiet_when_phases_finish_in_time():
    seen = []
    wd = Watchdog(0.3, on_timeout=seen.append, poll_s=0.02)
    for _ in range(5):
        with wd.phase("barrier"):
            time.sleep(0.02)
    time.sleep(0.5)  # idle (disarmed) time never counts
    wd.close()
    assert seen == []


def test_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout"):
        Watchdog(0)


def test_nvshmem_finalize_at_exit_is_watched(monkeypatch):
    """NvshmemStore.finalize runs NVSHMEM's finalize under a watchdog phase: a finalize that does
    not return fires it (the default action aborts the job with the message) instead of hanging."""
    import sys
    import threading
    import types

    import torch

    from mgg.runtime import nvshmem_store, watchdog

    release = threading.Event()
    fake = types.ModuleType("nvshmem.core")
    fake.free_tensor = lambda t: None
    fake.finalize = lambda: release.wait(5)          # a finalize that waits on a peer
    monkeypatch.setitem(sys.modules, "nvshmem", types.ModuleType("nvshmem"))
    monkeypatch.setitem(sys.modules, "nvshmem.core", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(nvshmem_store, "FINALIZE_TIMEOUT_S", 0.2)
    fired = []

    class Recording(watchdog.Watchdog):
        def __init__(self, timeout_s, rank=0):
            super().__init__(timeout_s, rank=rank, on_timeout=lambda m: (fired.append(m), release.set()),
                             poll_s=0.02)
    monkeypatch.setattr(watchdog, "Watchdog", Recording)
    store = object.__new__(nvshmem_store.NvshmemStore)
    store._closed, store._live, store._reduce_bufs = False, 0, {}
    store.comm = types.SimpleNamespace(rank=1, barrier=lambda: None)
    store.finalize()
    assert len(fired) == 1 and "rank 1" in fired[0] and "NVSHMEM finalize at exit" in fired[0]
    store.finalize()                                  # once only
    assert len(fired) == 1


def test_nvshmem_host_collectives_wait_for_quiet_streams(monkeypatch):
    """Every host-side NVSHMEM collective (an array's malloc and free, the reduction buffers'
    malloc, finalize) comes after this GPU's streams drained and an MPI barrier: a malloc whose
    internal barrier overlaps a peer's queued on-stream barrier hung a P = 4 run."""
    import sys
    import types

    import torch

    from mgg.runtime import nvshmem_store

    calls = []
    fake = types.ModuleType("nvshmem.core")
    fake.tensor = lambda shape, dtype: (calls.append("malloc"), torch.zeros(shape, dtype=dtype))[1]
    fake.free_tensor = lambda t: calls.append("free")
    fake.finalize = lambda: calls.append("finalize")
    fake.reduce = lambda team, dst, src, op, stream=None: calls.append("reduce")
    fake.Teams = types.SimpleNamespace(TEAM_WORLD=0)
    monkeypatch.setitem(sys.modules, "nvshmem", types.ModuleType("nvshmem"))
    monkeypatch.setitem(sys.modules, "nvshmem.core", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda *a: types.SimpleNamespace(synchronize=lambda: calls.append("sync"), cuda_stream=0))
    monkeypatch.setattr(nvshmem_store, "StreamRef", lambda s: s)
    store = object.__new__(nvshmem_store.NvshmemStore)
    store._closed, store._live, store._reduce_bufs = False, 0, {}
    store.comm = types.SimpleNamespace(rank=0, barrier=lambda: calls.append("barrier"))

    def before(op):  # each `op` call: a drain, then a barrier, since the last on-stream collective
        for i, c in enumerate(calls):
            if c == op:
                last = max([j for j in range(i) if calls[j] == "reduce"], default=-1)
                window = calls[last + 1:i]
                assert "sync" in window and "barrier" in window and \
                    window.index("sync") < len(window) - 1 - window[::-1].index("barrier"), calls

    arr = store.allocate(5, 3)
    assert calls.count("malloc") == 1
    before("malloc")
    calls.clear()
    arr.free()
    before("free")
    calls.clear()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert store.allreduce_sum_(torch.ones(4))
    assert calls.count("malloc") == 2 and calls.count("reduce") == 1
    before("malloc")
    calls.clear()
    store.finalize()
    before("free")
    assert calls[-1] == "finalize"
