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
