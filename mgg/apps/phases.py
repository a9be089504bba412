"""Startup phases of a training run: timed on every rank, printed by rank 0 as each one ends, and
reported (max over ranks) in the metrics JSON as `phases` with `time_to_first_epoch_s`.

Phases, in order: init (process start to the start of loading: interpreter, imports, MPI and
the communicator), load (read or generate the dataset), reorder (an explicit --reorder-nodes, or auto on a graph of
65,536 nodes or more: mgg.apps.node_order), prepare (features, labels, masks),
partition (ranges, this rank's forward and transposed rows: `DistGraph` construction without the
store), store (the symmetric store: MPI window or NVSHMEM init), data (this rank's features, labels and
masks onto its device, and the row sets of the training and evaluated rows), plan (forward and
transposed plans of the model's aggregation kind), build (the rest of the run's CUDA kernel
builds, which start in the background before load -- mgg.apps.kernel_prebuild --, the run's
modules loaded onto its GPU, the executors with their plans uploaded), model (the model replica,
its broadcast and the optimizer), first_epoch (the first training epoch and its evaluation). Together they cover the time to the end of the first epoch.

The init phase is told in parts (`init_parts_s` in the metrics JSON, max over ranks, and rank 0's
init line): the time to the app's entry (interpreter and imports), then each step the app marks
with `mark_init` before loading (arguments and MPI, the backend check, the GPU memory query, the
start of the background kernel builds).

At each phase's end the clock also reads the process's peak host memory so far and torch's peak
GPU allocation so far (`phase_peaks_mb` in the metrics JSON, max over ranks, and rank 0's phase
line), so the phase that raised a peak is the first whose figure reaches it.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .memory_report import gpu_peak_mb, host_peak_mb

__all__ = ["PhaseClock", "process_age_s", "mark_init", "init_parts", "PHASES"]

PHASES = ("init", "load", "reorder", "prepare", "partition", "store", "data", "plan", "build", "model",
          "first_epoch")


def _start_age_s() -> float:
    """Seconds since this process started, read once (Linux: /proc start time vs uptime, both at
    clock-tick resolution; elsewhere 0, i.e. ages count from this module's import)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


# The process start on the perf_counter clock: every later age is a perf_counter difference, so
# ages and phase durations (also perf_counter differences) add up consistently.
_PROCESS_START = time.perf_counter() - _start_age_s()


def process_age_s() -> float:
    """Seconds since this process started, on the same clock as the phase durations."""
    return time.perf_counter() - _PROCESS_START


_INIT_MARKS: list[tuple[str, float]] = []  # (step that just ended, process age at its end)


def mark_init(step: str, first: bool = False) -> None:
    """Record that init step `step` ended now (its length: since the previous mark, or since the
    process started for the first one). `first`: a new run's first step (earlier marks dropped)."""
    if first:
        _INIT_MARKS.clear()
    _INIT_MARKS.append((step, process_age_s()))


def init_parts(end_s: float) -> dict[str, float]:
    """{step: seconds} of the marks so far, and "other" up to `end_s` (the init phase's end);
    the marks are cleared (one run per process)."""
    parts, last = {}, 0.0
    for step, age in _INIT_MARKS:
        parts[step] = parts.get(step, 0.0) + max(0.0, age - last)
        last = age
    if end_s - last > 0.005 or not parts:
        parts["other"] = max(0.0, end_s - last)
    _INIT_MARKS.clear()
    return parts


class PhaseClock:
    """Seconds per phase on this rank; rank 0 prints `phase NAME: S s` on stdout as a phase ends
    (when `show`). `reduced()` is collective: the max over ranks of every phase."""

    def __init__(self, comm, show: bool = True):
        self.comm = comm
        self.show = bool(show) and comm.rank == 0
        self.seconds: dict[str, float] = {}
        self.peaks_mb: dict[str, tuple[float, float]] = {}  # phase -> (host, GPU) peak so far at its end
        self.init_parts_s: dict[str, float] = {}
        self.first_epoch_end_s: float | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield  # a phase that raised is not recorded
        self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Record `seconds` of phase `name` (measured elsewhere, e.g. inside DistGraph); for
        "init", also its parts (`init_parts`)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)
        host, gpu = host_peak_mb(), gpu_peak_mb()
        self.peaks_mb[name] = (host, gpu)
        parts = ""
        if name == "init":
            self.init_parts_s = init_parts(float(seconds))
            parts = "; " + ", ".join(f"{k} {v:.2f}" for k, v in self.init_parts_s.items())
        if self.show:
            gpu_part = f", GPU {gpu:,.0f} MiB" if gpu else ""
            sys.stdout.write(f"phase {name}: {seconds:.2f} s (peak so far: host {host:,.0f} MiB{gpu_part}{parts})\n")
            sys.stdout.flush()

    def first_epoch_done(self) -> None:
        """Mark the end of the first epoch (time from process start)."""
        if self.first_epoch_end_s is None:
            self.first_epoch_end_s = process_age_s()

    def reduced(self) -> tuple[dict[str, float], float | None]:
        """({phase: max seconds over ranks} in PHASES order, max time to the first epoch's end).
        Collective: every rank calls it once, after training; `reduced_peaks_mb` is filled too."""
        names = [p for p in PHASES if p in self.seconds] + [p for p in self.seconds if p not in PHASES]
        peaks = [v for p in names for v in self.peaks_mb.get(p, (0.0, 0.0))]
        steps = list(self.init_parts_s)
        steps = self.comm.bcast(steps) if self.comm.size > 1 else steps  # every rank marks the same steps
        vals = ([self.seconds[p] for p in names] + peaks + [self.init_parts_s.get(k, 0.0) for k in steps]
                + [self.first_epoch_end_s if self.first_epoch_end_s is not None else -1.0])
        got = self.comm.allreduce_(np.asarray(vals, dtype=np.float64), "max").tolist()
        first = got[-1] if got[-1] >= 0 else None
        k = len(names)
        #: {phase: {"host": MiB, "gpu": MiB}}: the peaks so far at each phase's end, max over ranks
        self.reduced_peaks_mb = {p: {"host": round(got[k + 2 * i], 1), "gpu": round(got[k + 2 * i + 1], 1)}
                                 for i, p in enumerate(names)}
        #: {init step: seconds}, max over ranks
        self.reduced_init_parts_s = dict(zip(steps, got[3 * k: 3 * k + len(steps)]))
        return dict(zip(names, got[:k])), first
