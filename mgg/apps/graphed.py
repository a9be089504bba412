"""`--cuda-graph`: the full-graph training step captured once in a CUDA graph, then replayed.

At P = 2 the eager step is bound by the host: on 2x H100 one `halo_csr` aggregation takes
0.67 ms of launches, and reddit-like GCN's step runs in 5.31 ms eager against 3.01 ms replayed
from a graph (`bench/fullgraph.py --cuda-graph`, docs/kernels.md). `CapturedStep` brings that to
the training loop:

* epochs 1 .. `warmup` run eagerly (kernels built or loaded, executors, schedules and buffers
  allocated: nothing lazy is left for the capture);
* the next epoch captures the step (forward, backward, the gradient all-reduce on the stream,
  the capturable Adam step) and replays it; later epochs replay it. The loss is the graph's
  output tensor, refreshed by each replay;
* every rank tries the capture; the ranks then agree (one host all-reduce), and if any rank
  failed every rank drops its graph and goes on eagerly, with the reason in `why_eager`, so the
  ranks never disagree about which collectives run.

What a replay cannot change is refused before training (mgg.apps.full): the runtime tuner (it
switches kernels between steps) and --profile-steps (host timers between the parts). Dropout
draws its seeds from a counter on the GPU (mgg.nn.functional.DeviceSeeds, set up by
mgg.apps.full): a host seed would be frozen into the graph. Adam must be `capturable` (its step
counts on the GPU). A step with a host synchronisation (e.g. batch norm's all-reduce at P > 1
over a store without an on-device reduction) fails to capture and runs eagerly.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["CapturedStep"]


class CapturedStep:
    """Replays `step(epoch)` from a CUDA graph after `warmup` eager epochs (see the module).

    Args:
        step: the eager training step; returns this rank's loss as a 0-d tensor.
        comm: the communicator (the capture outcome is agreed over it).
        warmup: eager epochs before the capture (>= 1).
    Attributes:
        captured: a graph is being replayed. why_eager: why not ("" while warming up or captured).
    """

    def __init__(self, step: Callable[[int], Any], comm, warmup: int = 2):
        if warmup < 1:
            raise ValueError(f"CapturedStep: warmup must be >= 1, got {warmup}")
        self.step, self.comm, self.warmup = step, comm, warmup
        self.graph = None
        self.loss = None
        self.captured = False
        self.why_eager = ""
        self._eager_epochs = 0

    def __call__(self, epoch: int):
        if self.captured:
            self.graph.replay()
            return self.loss
        if self.why_eager or self._eager_epochs < self.warmup:
            self._eager_epochs += 1
            return self.step(epoch)
        self._capture(epoch)
        if self.captured:
            self.graph.replay()  # the capture only records: this epoch's step runs now
            return self.loss
        return self.step(epoch)

    def _capture(self, epoch: int) -> None:
        import torch

        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        why = ""
        try:
            with torch.cuda.graph(graph):
                loss = self.step(epoch)
        except Exception as e:  # noqa: BLE001 - the reason is reported, the run goes on eagerly
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        failed = self.comm.allreduce_scalar(1.0 if why else 0.0, "max") > 0
        if failed:
            graph.reset()
            torch.cuda.synchronize()
            self.why_eager = why or "another rank could not capture the step"
            if self.comm.rank == 0:
                import sys

                print(f"mgg: --cuda-graph: the training step could not be captured ({self.why_eager}); "
                      f"training goes on without the graph", file=sys.stderr, flush=True)
            return
        self.graph, self.loss, self.captured = graph, loss, True

    def close(self) -> None:
        """Release the graph once training is over (idempotent): synchronise, then reset it, so
        that nothing captured, NVSHMEM's on-stream barriers and reductions included, is alive when
        the store finalizes NVSHMEM at exit. (On 2x H200 a `--dropout 0 --cuda-graph` run at P = 2
        printed its results, then both ranks waited in nvshmem finalize with the graph still
        alive.) Later calls run the step eagerly."""
        if self.graph is None:
            return
        import torch

        graph, self.graph, self.loss, self.captured = self.graph, None, None, False
        try:
            torch.cuda.synchronize()
        finally:  # after a failed step the sync may raise: the graph is released all the same
            graph.reset()
        self.why_eager = self.why_eager or "released after training"
