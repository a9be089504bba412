"""Where a training step's time goes (`--profile-steps`): the parts of every full-graph step.

Spans, timed with CUDA events on the current stream on the GPU (one synchronisation per step, at
its end) and with `time.perf_counter` on the CPU:

    forward      the model's forward pass and the loss
    backward     loss.backward()
    allreduce    the gradient all-reduce (mgg.nn.allreduce_gradients)
    optimizer    the optimizer step
    aggregate    every forward `dg.aggregate` (inside forward; with the store's publish/release
                 barriers, so it includes waiting for the slowest rank)
    aggregate_t  every transposed `dg.aggregate` (inside backward)
    dense        forward + backward - aggregate - aggregate_t (layers, activations, loss, autograd)

`summary(comm)` (collective) gives, per part, the median over the profiled steps of the max over
ranks, in milliseconds, and `step`: the median total of forward + backward + allreduce +
optimizer. Evaluation forward passes are not counted.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

__all__ = ["StepProfile", "PARTS"]

PARTS = ("forward", "backward", "allreduce", "optimizer", "aggregate", "aggregate_t")


class StepProfile:
    """Per-step span times of one rank (see the module docstring). `attach(dg)` wraps
    `dg.aggregate` while a step runs; `detach()` restores it."""

    def __init__(self, cuda: bool):
        self.cuda = bool(cuda)
        self.steps: list[dict[str, float]] = []
        self._open: list[tuple[str, Any, Any]] = []  # (part, start, end) of the running step
        self._dg = self._orig = None
        self._in_step = False

    # -- timing ---------------------------------------------------------------------------------
    def _stamp(self):
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    @contextmanager
    def span(self, part: str) -> Iterator[None]:
        """Time the block as `part` (any number of times per step; they add up)."""
        a = self._stamp()
        try:
            yield
        finally:
            self._open.append((part, a, self._stamp()))

    @contextmanager
    def step(self) -> Iterator[None]:
        """One training step: spans recorded inside are summed into one row at its end."""
        self._open.clear()
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        row = dict.fromkeys(PARTS, 0.0)
        for part, a, b in self._open:
            row[part] += a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        self._open.clear()
        self.steps.append(row)

    # -- the aggregations ------------------------------------------------------------------------
    def attach(self, dg: Any) -> None:
        """Time `dg.aggregate` calls made inside `step()` (forward and transposed apart)."""
        self._dg, self._orig = dg, dg.aggregate
        orig = self._orig

        def timed(x, kind, transposed=False, **kw):
            if not self._in_step:
                return orig(x, kind, transposed, **kw)
            with self.span("aggregate_t" if transposed else "aggregate"):
                return orig(x, kind, transposed, **kw)
        dg.aggregate = timed

    def detach(self) -> None:
        if self._dg is not None:
            self._dg.aggregate = self._orig
            self._dg = self._orig = None

    # -- the report ----------------------------------------------------------------------------
    def summary(self, comm) -> dict:
        """{part: median over steps of the max over ranks (ms)} plus "dense", "step" and
        "steps" (how many were profiled). Collective; every rank has profiled as many steps."""
        if not self.steps:
            return {}
        table = np.array([[r[p] for p in PARTS] for r in self.steps], dtype=np.float64)
        comm.allreduce_(table.reshape(-1), "max")
        out = {p: round(float(statistics.median(table[:, i])), 4) for i, p in enumerate(PARTS)}
        f, b = table[:, PARTS.index("forward")], table[:, PARTS.index("backward")]
        agg = table[:, PARTS.index("aggregate")] + table[:, PARTS.index("aggregate_t")]
        out["dense"] = round(float(statistics.median(np.maximum(f + b - agg, 0.0))), 4)
        total = table[:, :4].sum(axis=1)
        out["step"] = round(float(statistics.median(total)), 4)
        out["steps"] = len(self.steps)
        return out
