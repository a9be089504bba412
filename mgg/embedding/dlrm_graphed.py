"""The DLRM training step replayed from a CUDA graph (GPU store).

The eager step (`MggDLRM.step`) launches a few hundred small kernels a step, and the host issuing
them is what it waits for. `GraphedDLRMStep` records the step once over static input buffers and
replays it:

* the first `warmup` steps run eagerly (kernels loaded, the store's reduction buffers allocated,
  the lookup's per-shape vectors cached);
* the next step reserves, collectively, the fixed-shape gradient exchange (every PE's slot count,
  the batch's ids + 1, an upper bound of what it sends to one PE; one host all-reduce of the
  maximum), copies the batch into the buffers and trains it with the capturable form of the step
  on a side stream, so nothing lazy is left; then it records that form in a CUDA graph;
* later batches of the buffers' shapes are copied into them and the graph is replayed; a batch
  of another shape runs eagerly, on every rank (the ranks agree by one host all-reduce a step).

The capturable form (`step(..., fixed=True)` of the owner) differs from the eager step in what it
reads on the host, not in what it computes: the lookup with checks "deferred" (no status read),
pooling by `mgg.embedding.capturable_pool` (the same sums to float rounding), the row gradients
exchanged and summed in a fixed shape and applied under a mask (`reduce_gradients_fixed`,
`step(fixed=True)` of the sparse optimizer), the MLP update one foreach add.

Bad ids: the captured step sums every rank's error flag (its tables' status records, on the
device) with the MLP gradients and multiplies all of the step's gradients by "no rank had an
error", so a step with bad input changes no table, no optimizer state and no weight. After each
replay (and the capture step) the status records are read (one synchronisation a step) and the
ranks agree (one host all-reduce of a flag; the messages only when one is set); every rank then
raises the lowest failing rank's error, the message the eager step gives (`IndexError: table C3:
index 70 out of range [0, 60)`).

A capture that fails on any rank leaves every rank eager (the ranks agree by one host all-reduce),
with the reason in `why_eager`; a table pooled with "max" (whose pooling reads the host) is refused
before the capture. `close()` releases the graph (synchronised) before the store's buffers go.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from .capturable_pool import CAPTURABLE_MODES

__all__ = ["GraphedDLRMStep", "refusal"]


def refusal(emb) -> str:
    """Why the training step over `emb` (a MultiTableEmbeddingBag) cannot be captured, "" when it
    can. The same on every rank: it depends only on the tables and the store."""
    if not getattr(emb, "_gpu", False):
        return "the tables are not on the GPU store"
    for t, cfg in enumerate(emb.tables):
        if cfg.mode not in CAPTURABLE_MODES:
            return (f"table {cfg.name or t} pools with mode {cfg.mode!r}: F.embedding_bag's CUDA backward "
                    f"reads the host")
    return ""


@dataclass
class _Buffers:
    """The static inputs of the captured step (on the tables' GPU)."""

    dense: torch.Tensor     # float32 [B, 13]
    ids: list               # T int tensors [B]
    offsets: torch.Tensor   # int [B]
    labels: torch.Tensor    # float32 [B]

    @staticmethod
    def like(batch, device) -> _Buffers:
        empty = lambda t: torch.empty_like(t, device=device)  # noqa: E731
        return _Buffers(empty(batch.dense), [empty(i) for i in batch.ids], empty(batch.offsets), empty(batch.labels))

    def fits(self, batch) -> bool:
        """Whether `batch` has the buffers' shapes and dtypes."""
        same = lambda a, b: a.shape == b.shape and a.dtype == b.dtype  # noqa: E731
        return (same(self.dense, batch.dense) and same(self.offsets, batch.offsets) and same(self.labels, batch.labels)
                and len(self.ids) == len(batch.ids) and all(same(a, b) for a, b in zip(self.ids, batch.ids)))

    def load(self, batch) -> None:
        """Copy `batch` in (T + 3 copies on the current stream)."""
        self.dense.copy_(batch.dense)
        for a, b in zip(self.ids, batch.ids):
            a.copy_(b)
        self.offsets.copy_(batch.offsets)
        self.labels.copy_(batch.labels)


class GraphedDLRMStep:
    """`step(batch)` -> this rank's share of the global mean loss (a 0-d tensor), replayed from a
    CUDA graph after `warmup` eager steps (see the module).

    Args:
        step: `step(dense, ids, offsets, labels, fixed)` -> the loss (0-d); fixed=True is the
            capturable form (the tables' module in its capture mode, `capture_mode()`).
        emb: the tables (a MultiTableEmbeddingBag on the GPU store).
        comm: the communicator (the capture outcome and the input errors are agreed over it).
        warmup: eager steps before the capture (>= 1).
    Attributes:
        captured: a graph is being replayed. replays, eager_steps: steps run each way (the capture
        step counts as eager). why_eager: why no graph ("" while warming up or captured).
    """

    def __init__(self, step: Callable, emb, comm, warmup: int = 2):
        if warmup < 1:
            raise ValueError(f"GraphedDLRMStep: warmup must be >= 1, got {warmup}")
        self.step, self.emb, self.comm, self.warmup = step, emb, comm, warmup
        self.graph = None
        self.bufs: _Buffers | None = None
        self.loss: torch.Tensor | None = None
        self.captured = False
        self.why_eager = ""
        self.replays = self.eager_steps = 0
        self._held: list[torch.Tensor] = []  # tensors the graph reads that nothing else keeps

    def __call__(self, batch) -> torch.Tensor:
        if self.captured and self._all_fit(batch):
            self.bufs.load(batch)
            self.graph.replay()
            self.replays += 1
            loss = self.loss.clone()  # the graph's output is overwritten by the next replay
            self.raise_input_errors()
            return loss
        self.eager_steps += 1
        if self.why_eager or self.captured or self.eager_steps <= self.warmup:
            return self.step(batch.dense, batch.ids, batch.offsets, batch.labels, False)
        why = refusal(self.emb)
        if why:
            self.why_eager = why
            return self.step(batch.dense, batch.ids, batch.offsets, batch.labels, False)
        return self._capture(batch)

    def _all_fit(self, batch) -> bool:
        """Whether every rank's batch fits the buffers (one host all-reduce at P > 1): the ranks
        replay together or step eagerly together, as the two forms exchange the row gradients
        through different collectives."""
        fits = self.bufs.fits(batch)
        if self.comm.size == 1:
            return fits
        return self.comm.allreduce_scalar(0.0 if fits else 1.0, "max") == 0

    @contextlib.contextmanager
    def capture_mode(self):
        """The tables' module in the capturable form: checks "deferred", capturable pooling."""
        emb = self.emb
        saved = emb.checks, emb.capturable_pooling
        emb.checks, emb.capturable_pooling = "deferred", True
        try:
            yield
        finally:
            emb.checks, emb.capturable_pooling = saved

    def raise_input_errors(self) -> None:
        """Read the status records (one synchronisation) and agree over the ranks: every rank
        raises the lowest failing rank's error (its type and message), or none does."""
        err = None
        try:
            self.emb.raise_input_errors()
        except (IndexError, ValueError) as e:
            err = e
        if self.comm.size == 1:
            if err is not None:
                raise err
            return
        if self.comm.allreduce_scalar(0.0 if err is None else 1.0, "max") == 0:
            return
        parts = self.comm.allgather(None if err is None else (type(err).__name__, str(err)))
        kind, msg = next(p for p in parts if p is not None)
        raise (IndexError if kind == "IndexError" else ValueError)(msg)

    def _capture(self, batch) -> torch.Tensor:
        dev = self.emb.array.local.device
        self.bufs = _Buffers.like(batch, dev)
        self.emb.reserve_fixed_gradients(sum(int(i.numel()) for i in batch.ids) + 1)  # collective
        self.bufs.load(batch)
        b = self.bufs
        cur = torch.cuda.current_stream(dev)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(cur)
        with torch.cuda.stream(side), self.capture_mode():  # this batch's update, and the warm-up
            loss = self.step(b.dense, b.ids, b.offsets, b.labels, True)
        cur.wait_stream(side)
        loss = loss.clone()
        self.raise_input_errors()
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        why = ""
        try:
            with self.capture_mode(), torch.cuda.graph(graph):
                out = self.step(b.dense, b.ids, b.offsets, b.labels, True)
        except Exception as e:  # noqa: BLE001 - the reason is reported, the run goes on eagerly
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        failed = self.comm.allreduce_scalar(1.0 if why else 0.0, "max") > 0
        if failed:
            self.emb.clear_gradients()
            graph.reset()
            torch.cuda.synchronize(dev)
            self.why_eager = why or "another rank could not capture the step"
            self.bufs = None
            return loss
        self.graph, self.loss, self.captured = graph, out, True
        self._held = self.emb.capture_refs()
        return loss

    def close(self) -> None:
        """Release the graph (idempotent): synchronise, then reset it, so that nothing captured
        (NVSHMEM's on-stream barriers and all-to-alls included) outlives the buffers it uses.
        Later calls run eagerly."""
        if self.graph is None:
            return
        graph, self.graph, self.loss, self.captured = self.graph, None, None, False
        try:
            torch.cuda.synchronize()
        finally:
            graph.reset()
            self._held = []
        self.why_eager = self.why_eager or "released"
