"""A stand-in for torch.cuda.CUDAGraph in tests of a step's control flow on the CPU (warm-up,
capture, replay, eager fallbacks): it counts replays and remembers a reset."""
from __future__ import annotations

__all__ = ["RecordingGraph"]


class RecordingGraph:
    """`replay()` counts (`replays`); `reset()` sets `reset_called`."""

    def __init__(self):
        self.replays = 0
        self.reset_called = False

    def replay(self) -> None:
        self.replays += 1

    def reset(self) -> None:
        self.reset_called = True
