"""The epoch skeleton that the full-graph (full.py) and the sampled (sampled.py) loops share.

Per epoch: barrier, the loop's timed training step, barrier (the epoch time), then one all-reduce
that agrees on the loss, the stop flag, the loop's named counters and, on evaluation epochs, the
correct/total counts of the train/val/test masks; then the epoch is recorded, the progress bar
advanced and the loop's end-of-epoch work (checkpoints) done. What differs between the loops is
an `EpochHooks` object.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from .config import TrainConfig, TrainResult, UserError

__all__ = ["LocalData", "EpochHooks", "EpochSums", "LoopState", "Teardown", "build_distgraph", "distgraph_session",
           "local_data", "mask_counts", "register_row_sets", "ROW_SET_MAX_SHARE", "STOP_SIGNALS", "reduce_epoch", "run_epochs", "finish", "untimed", "tuning_summary",
           "progress_bar", "MASKS"]

MASKS = ("train", "val", "test")


@dataclass
class LocalData:
    """This rank's rows on dg.device."""

    x: Any                 # torch float32 [n_local, F]
    y: Any                 # torch int64 [n_local]
    masks: tuple           # torch bool [n_local] each: train, val, test
    n_train: float         # the global number of training nodes
    num_classes: int = 0   # over the whole graph
    train_rows: Any = None  # RowSet of the training rows (register_row_sets), or None: all rows
    eval_rows: Any = None   # RowSet of the rows any mask holds, or None: all rows
    train_layers: Any = None  # per layer: the rows it computes for the loss (RowSet or None)
    eval_layers: Any = None   # per layer: the rows it computes for an evaluation


#: a row set is used when it holds at most this share of the graph's nodes: below it the
#: restricted layers save more than their extra plans cost (plan time and memory)
ROW_SET_MAX_SHARE = 0.5


def register_row_sets(dg, data: LocalData, layers: int = 1) -> None:
    """Register, per layer of an `layers`-layer model, the rows it must compute for the loss
    (the training rows at the last layer, each earlier layer also their in-neighbours) and for
    an evaluation (the rows any mask holds): DistGraph.register_layer_rows, each set only while
    it holds at most ROW_SET_MAX_SHARE of the nodes (over all ranks, so every rank decides
    alike). Recorded in `data`. Collective; before the first plan is built."""
    import torch

    train = data.masks[0]
    evaluated = data.masks[0] | data.masks[1] | data.masks[2]
    for name, mask in (("train", train), ("eval", evaluated)):
        sets = dg.register_layer_rows(name, torch.nonzero(mask).reshape(-1), layers, ROW_SET_MAX_SHARE)
        setattr(data, f"{name}_layers", sets if any(r is not None for r in sets) else None)
        setattr(data, f"{name}_rows", sets[-1])


def build_distgraph(cfg: TrainConfig, comm, graph: Any):
    """Seed torch and numpy with cfg.seed and build the DistGraph (collective); --ranks-per-node
    applies to this build only (node-aware plans see the simulated nodes)."""
    import torch

    from ..graph import DistGraph, RuntimeConfig

    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    rcfg = RuntimeConfig(**cfg.knobs(), backend=cfg.backend, variant=cfg.variant, ps_inter=cfg.ps_inter,
                         storage_dtype=cfg.storage_dtype)
    saved_rpn = comm.ranks_per_node
    if cfg.ranks_per_node:
        comm.ranks_per_node = cfg.ranks_per_node
    try:
        return DistGraph.build(graph, comm, rcfg)
    finally:
        comm.ranks_per_node = saved_rpn


@dataclass
class Teardown:
    """What a loop must close before the DistGraph: `always` on any exit of this rank (local
    resources), `together` only when every rank gets there (collective ones)."""

    always: list[Callable[[], None]] = field(default_factory=list)
    together: list[Callable[[], None]] = field(default_factory=list)


@contextmanager
def distgraph_session(cfg: TrainConfig, comm, graph: Any) -> Iterator[tuple[Any, Teardown]]:
    """Build the DistGraph; on leaving, close what the loop registered and then the DistGraph.

    dg.close() is collective: it runs only on a normal exit or a UserError (agreed on by every
    rank); after any other error the peers may be elsewhere and closing would hang.
    """
    dg = build_distgraph(cfg, comm, graph)
    teardown = Teardown()
    together = False
    try:
        yield dg, teardown
        together = True
    except UserError:
        together = True
        raise
    finally:
        for close in teardown.always:
            close()
        if together:
            for close in teardown.together:
                close()
            dg.close()


def local_data(dg, prep) -> LocalData:
    """This rank's rows of `prep` (a mgg.data.PreparedGraph, or a DeferredPrepared that reads
    only these rows) on dg.device. Collective; a bad row on any rank -> UserError on all."""
    from ..runtime import RankError

    try:
        rows = prep.rows(dg.lo, dg.hi, dg.comm)
    except (ValueError, RankError) as e:
        raise UserError(f"cannot load dataset: {e}") from e

    from ..runtime.transfer import host_to_device

    def local(a: np.ndarray):
        return host_to_device(a, dg.device)

    return LocalData(local(rows.x), local(rows.y), tuple(local(m) for m in (rows.train, rows.val, rows.test)),
                     float(rows.n_train), rows.num_classes)


def mask_counts(logits, data: LocalData) -> dict[str, float]:
    """{"<mask>_correct", "<mask>_total"} per mask of this rank's nodes (floats, to be summed).
    `logits`: float [n_local, C], or [len(data.eval_rows), C] for the rows of data.eval_rows."""
    pred = logits.argmax(dim=1)
    masks, y = data.masks, data.y
    if data.eval_rows is not None and logits.shape[0] != y.shape[0]:
        masks = tuple(m[data.eval_rows.index] for m in masks)
        y = y[data.eval_rows.index]
    out: dict[str, float] = {}
    for name, m in zip(MASKS, masks):
        out[f"{name}_correct"] = float((pred[m] == y[m]).sum().item())
        out[f"{name}_total"] = float(m.sum().item())
    return out


#: the signals that stop a run after an epoch (mgg.checkpoint.StopSignal), in the order the ranks
#: pick one when several were received
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


@dataclass
class EpochSums:
    """An epoch's values summed over the ranks (one all-reduce)."""

    loss: float
    stop: str                               # the signal some rank was asked to stop by ("": none)
    values: dict[str, float]                # the loop's named counters
    accuracies: dict[str, float] | None     # train_acc/val_acc/test_acc on evaluation epochs


def reduce_epoch(comm, loss: float, stop_requested: int, values: dict[str, float],
                 counts: dict[str, float] | None) -> EpochSums:
    """Sum the loss, the stop requests, `values` and the mask `counts` over the ranks in one
    all-reduce. `stop_requested`: the number of the signal this rank got (0: none); every rank
    then names the same signal (the first of STOP_SIGNALS that some rank got)."""
    import signal

    counts = counts or {}
    got = signal.Signals(int(stop_requested)).name if stop_requested else ""
    stops = [f"stop:{name}" for name in STOP_SIGNALS]
    names = ["loss", *stops, *values, *counts]
    raw = [float(loss), *(float(got == name) for name in STOP_SIGNALS), *values.values(), *counts.values()]
    if got and got not in STOP_SIGNALS:  # another signal handed to the loop: stop as on SIGTERM
        raw[1] = 1.0
    summed = dict(zip(names, comm.allreduce_(np.asarray(raw, dtype=np.float64)).tolist()))
    stop = next((name for name in STOP_SIGNALS if summed[f"stop:{name}"] > 0), "")
    accs = None
    if counts:
        accs = {f"{m}_acc": (summed[f"{m}_correct"] / summed[f"{m}_total"] if summed[f"{m}_total"]
                             else float("nan")) for m in MASKS}
    return EpochSums(summed["loss"], stop, {k: summed[k] for k in values}, accs)


class EpochHooks:
    """What differs between the loops. `model` is put in training mode before each timed step."""

    model: Any

    def train_step(self, epoch: int) -> Any:
        """The timed work of one epoch; returns this rank's share of the loss (float or tensor)."""
        raise NotImplementedError

    def after_step(self, epoch: int) -> None:
        """Right after the timed section (the tuner's step)."""

    def epoch_values(self) -> dict[str, float]:
        """Named counters of this rank to sum over the ranks with the loss."""
        return {}

    def eval_logits(self, data: LocalData):
        """Logits float32 [n_local, classes] of this rank's nodes for evaluation (under no_grad)."""
        raise NotImplementedError

    def record(self, rec: dict, values: dict[str, float]) -> None:
        """Add the summed counters to the epoch's record."""

    def end_epoch(self, epoch: int, state: "LoopState") -> None:
        """After the epoch is recorded (checkpoints)."""


@dataclass
class LoopState:
    """A loop's running state; `res` collects the epochs."""

    cfg: TrainConfig
    comm: Any
    dg: Any
    data: LocalData
    res: TrainResult
    stop: Any = None                        # a StopSignal (or None)
    bar: Any = None                         # tqdm progress bar (or None)
    last: dict = field(default_factory=lambda: {"train_acc": None, "val_acc": None, "test_acc": None})
    times: list[float] = field(default_factory=list)
    clock: Any = None                       # a PhaseClock (mgg.apps.phases): times the first epoch
    log: Any = None                         # rank 0's EpochLog (--log-jsonl, --tensorboard; mgg.apps.run_log)


def _timed_step(state: LoopState, hooks: EpochHooks, epoch: int) -> tuple[float, Any]:
    """(epoch milliseconds between barriers, this rank's loss) of one training step."""
    import torch

    hooks.model.train()
    state.comm.barrier()
    t0 = time.perf_counter()
    loss = hooks.train_step(epoch)
    if state.dg.device.type == "cuda":
        torch.cuda.synchronize(state.dg.device)
    state.comm.barrier()
    return (time.perf_counter() - t0) * 1e3, loss


def run_epochs(state: LoopState, hooks: EpochHooks, start: int = 0) -> None:
    """Epochs start + 1 .. cfg.epochs, or until the ranks agree to stop (`state.res.stopped`);
    each epoch's record also goes to rank 0's EpochLog (--log-jsonl, --tensorboard) at once."""
    from .run_log import open_epoch_log

    cfg, res = state.cfg, state.res
    if state.log is None:
        state.log = open_epoch_log(cfg, state.comm)
    try:
        _epochs(state, hooks, start)
    finally:
        if state.log is not None:
            state.log.close(res.epochs[-1]["epoch"] if res.epochs else start, res.stopped)
            state.log = None


def _epochs(state: LoopState, hooks: EpochHooks, start: int) -> None:
    import torch

    cfg, res = state.cfg, state.res
    t_first = time.perf_counter()
    for epoch in range(start + 1, cfg.epochs + 1):
        ms, loss = _timed_step(state, hooks, epoch)
        state.times.append(ms)
        hooks.after_step(epoch)
        requested = state.stop.requested if state.stop is not None else 0
        counts = None
        if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            with torch.no_grad():
                counts = mask_counts(hooks.eval_logits(state.data), state.data)
        sums = reduce_epoch(state.comm, float(loss), requested, hooks.epoch_values(), counts)
        if not math.isfinite(sums.loss):  # the loss is summed over the ranks: all of them stop here
            raise UserError(f"training diverged: the loss of epoch {epoch} is {sums.loss} "
                            "(try a lower --lr)")
        if sums.accuracies is not None:
            state.last = sums.accuracies
        rec = {"epoch": epoch, "loss": sums.loss, "train_acc": state.last["train_acc"],
               "val_acc": state.last["val_acc"], "epoch_ms": ms}
        hooks.record(rec, sums.values)
        if state.clock is not None and epoch == start + 1:
            state.clock.add("first_epoch", time.perf_counter() - t_first)
            state.clock.first_epoch_done()
        _close_epoch(state, rec, sums.stop, epoch)
        hooks.end_epoch(epoch, state)
        if res.stopped:
            break


def _close_epoch(state: LoopState, rec: dict, stop: str, epoch: int) -> None:
    """Record the epoch, advance the progress bar, and set res.stopped to the signal's name when
    some rank was asked to stop (`stop` is all-reduced, so every rank decides alike)."""
    state.res.epochs.append(rec)
    last = state.last
    if state.log is not None:
        state.log.epoch(rec, last["test_acc"])
    if state.bar is not None:
        state.bar.set_postfix(loss=f"{rec['loss']:.4f}", train=f"{last['train_acc'] or 0:.3f}",
                              val=f"{last['val_acc'] or 0:.3f}", refresh=False)
        state.bar.update(1)
    if stop and epoch < state.cfg.epochs:  # some rank got a stop signal: all stop here
        state.res.stopped = stop


def finish(state: LoopState, tuner=None) -> None:
    """Close the bar and fill the result's final metrics (collective: phases and memory are
    reduced over the ranks)."""
    from .memory_report import memory_report

    res, last = state.res, state.last
    if state.clock is not None:
        res.phases, res.time_to_first_epoch_s = state.clock.reduced()
        res.phase_peaks_mb = state.clock.reduced_peaks_mb
        res.init_parts_s = state.clock.reduced_init_parts_s
    res.memory = memory_report(state.comm, state.dg)
    if state.bar is not None:
        state.bar.close()
    res.train_acc, res.val_acc, res.test_acc = last["train_acc"], last["val_acc"], last["test_acc"]
    res.final_loss = res.epochs[-1]["loss"]
    res.median_epoch_ms = float(statistics.median(state.times))
    res.tuning = tuning_summary(state.dg, tuner)


class PlainProgress:
    """Progress as plain lines for logs, what tqdm would print as one long `\r` line when stderr is
    no terminal: `gcn x2: epoch 20/200 loss=... val=... (0.84 s/epoch, 3 min left)`, every `every`
    epochs, at the last, and whenever `min_interval_s` passed since the last line (a long CPU run
    shows it is alive). The rate counts this run's epochs only (not those resumed from)."""

    def __init__(self, total: int, initial: int, desc: str, every: int, min_interval_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.n, self.desc, self.every = total, initial, desc, max(1, every)
        self.postfix: dict[str, str] = {}
        self.min_interval_s, self._clock = min_interval_s, clock
        self._first, self._t0 = initial, clock()
        self._last = self._t0

    def set_postfix(self, refresh: bool = False, **kw) -> None:
        self.postfix = {k: str(v) for k, v in kw.items()}

    def update(self, k: int = 1) -> None:
        self.n += k
        now = self._clock()
        if self.n % self.every == 0 or self.n == self.total or now - self._last >= self.min_interval_s:
            self._last = now
            per_epoch = (now - self._t0) / max(1, self.n - self._first)
            pace = f"{per_epoch * 1e3:.0f} ms/epoch" if per_epoch < 1 else f"{per_epoch:.2f} s/epoch"
            left = f", {_duration(per_epoch * (self.total - self.n))} left" if self.n < self.total else ""
            extra = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            sys.stderr.write(f"{self.desc}: epoch {self.n}/{self.total} {extra} ({pace}{left})\n")
            sys.stderr.flush()

    def close(self) -> None:
        pass


def _duration(seconds: float) -> str:
    """'42 s', '12 min', '2.5 h': a time estimate, rounded as one reads it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def progress_bar(cfg: TrainConfig, comm, start: int = 0):
    """The epoch progress on rank 0: a tqdm bar on a terminal, plain lines every ~10% of the run
    when stderr is a pipe or a file (mpirun, logs); none with --no-progress or under CI."""
    from tqdm import tqdm

    show = cfg.progress and comm.rank == 0 and not os.environ.get("CI")
    desc = f"{cfg.model} x{comm.size}"
    if show and not sys.stderr.isatty():
        return PlainProgress(cfg.epochs, start, desc, every=max(1, cfg.epochs // 10))
    return tqdm(total=cfg.epochs, initial=start, desc=desc, unit="epoch", disable=not show,
                dynamic_ncols=True, leave=True)


@contextmanager
def untimed(timer) -> Iterator[None]:
    """Aggregations inside are not counted by the tuner's timer (the eval forward)."""
    if timer is not None:
        timer.paused = True
    try:
        yield
    finally:
        if timer is not None:
            timer.paused = False


def tuning_summary(dg, tuner) -> dict:
    """What the metrics JSON and the final line report: the configuration in effect and, with
    --tune, the tuner's summary (its best, search iterations, cache hit)."""
    p = dg.params
    doc = {"enabled": tuner is not None,
           "config": {"ps": p.ps, "dist": p.dist, "wpb": p.wpb, "ps_inter": p.ps_inter,
                      "variant": dg.config.variant}}
    if tuner is not None:
        doc.update(tuner.summary(), iterations=tuner.iterations)
    return doc
