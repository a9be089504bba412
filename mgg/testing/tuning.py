"""Synthetic inputs of the tuner's tests: a device's limits, a convex latency landscape, and the
training loop's side of mgg.tuning.AggregationTuner (the configurations it applies, the
latencies it reports)."""
from __future__ import annotations

import numpy as np

from ..tuning import AggregationTuner, DeviceLimits, TuneConfig

__all__ = ["GPU", "convex", "Applied", "drive"]

#: an H100-like device: 132 SMs, 227 KiB of opt-in shared memory per block
GPU = DeviceLimits(num_sms=132, smem_per_block_optin=232448, smem_per_sm=233472,
                   max_threads_per_block=1024, max_threads_per_sm=2048, name="test-gpu")


def convex(c: TuneConfig) -> float:
    """A latency (ms) convex in log2 space with a ps x wpb interaction (bigger blocks want smaller
    partitions); its optimum is near ps 8, dist 4, wpb 4."""
    a, b, w = np.log2(c.ps), np.log2(c.dist), np.log2(c.wpb)
    return 1.0 + 0.05 * (a - 3) ** 2 + 0.04 * (b - 2) ** 2 + 0.03 * (w - 2) ** 2 + 0.005 * a * w


class Applied:
    """The `apply` callback of an AggregationTuner: records every configuration applied."""

    def __init__(self):
        self.calls: list[TuneConfig] = []

    def __call__(self, cfg: TuneConfig) -> None:
        self.calls.append(cfg)

    @property
    def current(self) -> TuneConfig:
        """The configuration applied last."""
        return self.calls[-1]


def drive(tuner: AggregationTuner, applied: Applied, f, iters: int) -> None:
    """`iters` training iterations: each reports latency f(current configuration) to the tuner."""
    for _ in range(iters):
        tuner.step(f(applied.current))
