"""A watchdog that turns a stuck collective into an error instead of a silent hang.

A rank arms the watchdog before a collective phase (an all-reduce, an aggregation's barrier) and
disarms it after. A daemon thread checks the armed deadline; when a phase outlives `timeout_s`
the watchdog prints which rank was stuck in which phase and for how long, and aborts the whole
MPI job (`MPI_Abort`), so the job ends with a message instead of hanging until the scheduler's
wall-clock limit. Typical cause: another rank died without reaching the collective.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["Watchdog"]


class Watchdog:
    """Deadline monitor for collective phases.

    Args:
        timeout_s: seconds a single armed phase may take (> 0).
        rank: this rank, for the message.
        on_timeout: called with the message when a phase times out; the default writes it to
            stderr and aborts the job (MPI_Abort when MPI is initialised, else os._exit(3)).
        poll_s: how often the thread checks.
    """

    def __init__(self, timeout_s: float, rank: int = 0, on_timeout: Callable[[str], None] | None = None,
                 poll_s: float | None = None):
        if not timeout_s > 0:
            raise ValueError(f"watchdog timeout must be > 0 seconds, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.rank = rank
        self.on_timeout = on_timeout or self._abort
        self._poll = poll_s if poll_s is not None else min(1.0, self.timeout_s / 4)
        self._lock = threading.Lock()
        self._phase: str | None = None
        self._since = 0.0
        self._stop = threading.Event()
        self.fired: str | None = None
        self._thread = threading.Thread(target=self._run, name="mgg-watchdog", daemon=True)
        self._thread.start()

    @staticmethod
    def _abort(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        try:
            from mpi4py import MPI

            if MPI.Is_initialized() and not MPI.Is_finalized():
                MPI.COMM_WORLD.Abort(3)
        except ImportError:
            pass
        os._exit(3)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            with self._lock:
                phase, since = self._phase, self._since
            if phase is not None and time.monotonic() - since > self.timeout_s:
                msg = (f"mgg watchdog: rank {self.rank} waited {time.monotonic() - since:.1f} s in "
                       f"'{phase}' (timeout {self.timeout_s:g} s): a peer rank is probably dead or "
                       f"stuck; aborting the job")
                self.fired = msg
                with self._lock:
                    self._phase = None
                self.on_timeout(msg)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Arm for the duration of the block (phases do not nest: the inner one wins)."""
        with self._lock:
            prev = (self._phase, self._since)
            self._phase, self._since = name, time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._phase, self._since = prev if prev[0] is not None else (None, 0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self._poll + 1)
