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
    store.comm = types.SimpleNamespace(rank=1)
    store.finalize()
    assert len(fired) == 1 and "rank 1" in fired[0] and "NVSHMEM finalize at exit" in fired[0]
    store.finalize()                                  # once only
    assert len(fired) == 1
