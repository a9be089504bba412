"""`AggregationTuner`: the cross-iteration search driven by a real training loop.

    tuner = AggregationTuner.for_distgraph(dg, dim=max_width, cache_path=..., fingerprint=fp,
                                           variants=("pipelined", "ptr", "halo"), comm=comm)
    timer = AggregationTimer(dg)          # times every dg.aggregate call of an iteration
    for epoch in ...:
        ...forward, backward, optimizer step...
        tuner.step(timer.lap())           # applies the next configuration (or the best)

Per iteration: `step(latency_ms)` feeds the aggregation time of the iteration that just ran.
A switch applies the configuration and (through `DistGraphApplier`, `DistGraph.prepare`) re-cuts
the plans and builds the executors right away, outside the timed region, so the next iteration
is measured as is (`warmup=0`); `warmup=k` ignores k iterations after each switch where an
applier cannot prepare. Then `repeats` iterations are measured and their median reported. With a communicator the latency is the max over the ranks (the slowest
rank bounds the iteration), so every rank makes the same decisions; rank 0 reads the cache and
broadcasts the entry, and writes the cache and the log.
"""
from __future__ import annotations

import logging
import math
import os
import statistics
import time
from typing import Any, Callable, Sequence

from .cache import LOG_FORMAT, TuneKey, TuningCache, VERSION, atomic_write_json, kernel_version
from .model import DeviceLimits, PruneRules, TuneConfig, Workload, estimate
from .plancache import DistGraphApplier
from .search import CrossIterationSearch, SearchSpace, Trial

__all__ = ["AggregationTuner", "AggregationTimer", "distgraph_workload"]

log = logging.getLogger("mgg.tuner")


def distgraph_workload(dg: Any, kinds: Sequence[str], space: SearchSpace, comm: Any = None) -> Workload:
    """The workload of dg's forward and transposed plans of `kinds`, max over the ranks.

    Builds the plans (they are needed for training anyway). With `comm` (allgather) every rank
    gets the same table, so every rank's search takes the same decisions.
    """
    plans = [dg.plan(k, t) for k in kinds for t in (False, True)]
    w = Workload.from_plans(plans)
    inter_vals: list[int | None] = [None] + list(space.ps_values)
    table = w.table(space.ps_values, inter_vals)
    has_inter = w.has_inter
    if comm is not None and getattr(comm, "size", 1) > 1:
        gathered = comm.allgather((table, has_inter))
        table = Workload.max_tables(t for t, _ in gathered)
        has_inter = any(h for _, h in gathered)
    return Workload.from_table(table, has_inter)


class AggregationTuner:
    """Drives `CrossIterationSearch` from training iterations and applies its configurations.

    Args:
        apply: callable(TuneConfig) that puts a configuration in effect for the next iteration
            (e.g. `DistGraphApplier(dg)`), or a DistGraph (wrapped in a DistGraphApplier).
        dim: the largest embedding width the aggregations see (shared memory grows with it).
        limits: device limits (None: `DeviceLimits.detect()`).
        space: grid and search knobs; `variants` overrides `space.variants`.
        workload: partition counts for the model (None: feasibility rules only).
        rules: pruning rules (None: feasibility only).
        cache_path / key: the persisted tuning cache and this run's key (both or neither).
        log_path: where the tuning log (every trial, in order) is written when tuning ends.
        warmup: iterations ignored after each switch; repeats: iterations measured per report.
        comm: an mgg Communicator (rank, size, allreduce_scalar, bcast) or None.
        enabled: False -> apply nothing, step() is a no-op (a fixed --ps/--dist/--wpb run).
    """

    def __init__(self, apply: Callable[[TuneConfig], None] | Any, dim: int,
                 limits: DeviceLimits | None = None, *, space: SearchSpace | None = None,
                 variants: Sequence[str] | None = None, workload: Workload | None = None,
                 rules: PruneRules | None = PruneRules(), cache_path: str | os.PathLike | None = None,
                 key: TuneKey | None = None, log_path: str | os.PathLike | None = None,
                 warmup: int = 0, repeats: int = 1, comm: Any = None, enabled: bool = True):
        self.apply = apply if callable(apply) else DistGraphApplier(apply)
        self.dim = int(dim)
        self.limits = limits or DeviceLimits.detect()
        space = space or SearchSpace()
        if variants is not None:
            space = SearchSpace.from_dict({**space.to_dict(), "variants": tuple(variants)})
        self.space = space
        self.workload = workload
        self.rules = rules
        if (cache_path is None) != (key is None):
            raise ValueError("AggregationTuner: give both cache_path and key, or neither")
        self.cache = TuningCache(cache_path) if cache_path is not None else None
        self.key = key
        self.log_path = None if log_path is None else os.fspath(log_path)
        if warmup < 0 or repeats < 1:
            raise ValueError("AggregationTuner: warmup >= 0 and repeats >= 1")
        self.warmup, self.repeats = int(warmup), int(repeats)
        self.comm = comm
        self.enabled = bool(enabled)
        self.from_cache = False
        self.iterations = 0              # step() calls
        self.steady: list[float] = []    # latencies after tuning ended
        self._samples: list[float] = []
        self._skip = 0
        self.search: CrossIterationSearch | None = None
        self._best: TuneConfig | None = None
        self.current: TuneConfig | None = None
        if not self.enabled:
            return
        entry = self._lookup()
        if entry is not None:
            self.from_cache = True
            self._best = entry
            self._switch(entry)
            log.info("tuner: cache hit, using %s", entry.label())
        else:
            self._new_search()
            self._switch(self.search.next_config())

    # -- construction helpers ------------------------------------------------------------------
    @classmethod
    def for_distgraph(cls, dg: Any, dim: int, *, kinds: Sequence[str] = ("gcn",),
                      fingerprint: str | None = None, cache_path: str | os.PathLike | None = None,
                      extra: str = "", comm: Any = None, limits: DeviceLimits | None = None,
                      space: SearchSpace | None = None, **kw: Any) -> "AggregationTuner":
        """A tuner for a DistGraph: limits of dg's device, its plans' workload (max over ranks),
        a DistGraphApplier (dg keeps the per-ps cuts and recent executors), and the cache key (fingerprint, P, dim, device,
        kernel_version(), extra + kinds + variants)."""
        comm = comm if comm is not None else getattr(dg, "comm", None)
        if limits is None:
            dev = getattr(dg, "device", None)
            limits = DeviceLimits.from_device(dev) if getattr(dev, "type", "cpu") == "cuda" \
                else DeviceLimits.cpu()
        space = space or SearchSpace()
        variants = kw.get("variants")
        vs = tuple(variants) if variants is not None else space.variants
        key = None
        if cache_path is not None:
            if fingerprint is None:
                raise ValueError("for_distgraph: a cache_path needs the graph fingerprint")
            key = TuneKey(fingerprint, int(getattr(dg, "world_size", 1)), int(dim), limits.name,
                          kernel_version(), "|".join(filter(None, [extra, "kinds=" + ",".join(kinds),
                                                                   "variants=" + ",".join(vs)])))
        wl = distgraph_workload(dg, kinds, space, comm)
        return cls(DistGraphApplier(dg), dim, limits, space=space, workload=wl,
                   cache_path=cache_path, key=key, comm=comm, **kw)

    def _new_search(self) -> None:
        self.search = CrossIterationSearch(self.dim, self.limits, self.space, self.workload, self.rules)

    def _rank0(self) -> bool:
        return self.comm is None or getattr(self.comm, "rank", 0) == 0

    def _lookup(self) -> TuneConfig | None:
        best = None
        if self.cache is not None and self._rank0():
            try:
                e = self.cache.lookup(self.key)
            except OSError as err:  # e.g. the .corrupt rename failed: tune from scratch
                log.warning("tuner: cache %s: %s (ignored)", self.cache.path, err)
                e = None
            if e is not None:
                est = estimate(e.best, self.dim, self.limits)
                if not est.feasible or e.best.variant not in self.space.variants:
                    log.warning("tuner: cached %s does not fit here (%s); tuning again",
                                e.best.label(), est.reason or "variant not offered")
                else:
                    best = e.best.to_dict()
        if self.comm is not None and getattr(self.comm, "size", 1) > 1:
            best = self.comm.bcast(best)
        return None if best is None else TuneConfig.from_dict(best)

    # -- the loop ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return not self.enabled or self.search is None or self.search.done

    @property
    def best(self) -> TuneConfig | None:
        """The configuration applied for the rest of training once `done` (so far, before)."""
        if self._best is not None:
            return self._best
        return None if self.search is None else self.search.best

    @property
    def search_iterations(self) -> int:
        """Measurements the search took (0 on a cache hit)."""
        return 0 if self.search is None else len(self.search.trials)

    def _switch(self, cfg: TuneConfig) -> None:
        if cfg != self.current:
            self.apply(cfg)
            self.current = cfg
            self._skip = self.warmup
        self._samples = []

    def step(self, latency_ms: float) -> TuneConfig | None:
        """Feed the aggregation latency (ms) of the iteration that just ran with `current`.

        Collective when a communicator was given and the tuner is still searching (one scalar
        all-reduce on the steps that report). Returns the configuration newly applied for the
        next iteration, or None when it did not change.
        """
        self.iterations += 1
        if self.done:
            if self.enabled:
                self.steady.append(float(latency_ms))
            return None
        if self._skip > 0:
            self._skip -= 1
            return None
        lat = float(latency_ms)
        if not math.isfinite(lat):
            raise ValueError(f"AggregationTuner.step: latency {latency_ms!r} is not finite")
        self._samples.append(max(lat, 1e-6))
        if len(self._samples) < self.repeats:
            return None
        lat = statistics.median(self._samples)
        if self.comm is not None and getattr(self.comm, "size", 1) > 1:
            lat = float(self.comm.allreduce_scalar(lat, "max"))
        before = self.current
        self.search.report(self.current, lat)
        nxt = self.search.next_config()
        if nxt is None:
            self._finish()
        else:
            self._switch(nxt)
        return self.current if self.current != before else None

    def _finish(self) -> None:
        best = self.search.best
        self._best = best
        self._switch(best)
        release = getattr(self.apply, "release", None)
        if release is not None:  # free the cuts and executors of the other configurations
            release()
        log.info("tuner: done after %d measurements: %s (%.3f ms)", len(self.search.trials),
                 best.label(), self.search.latency(best))
        if not self._rank0():
            return
        if self.cache is not None:
            try:
                self.cache.store(self.key, best, self.search.latency(best), len(self.search.trials))
            except OSError as e:
                log.warning("tuner: cannot write the tuning cache %s: %s", self.cache.path, e)
        if self.log_path is not None:
            try:
                self.write_log(self.log_path)
            except OSError as e:
                log.warning("tuner: cannot write the tuning log %s: %s", self.log_path, e)

    # -- records -------------------------------------------------------------------------------
    def log_dict(self) -> dict:
        """The tuning log (see mgg.tuning.cache for the format)."""
        trials = [] if self.search is None else [t.to_dict() for t in self.search.trials]
        best = self.best
        lat = None
        if self.search is not None and best is not None and best in self.search.table:
            lat = self.search.latency(best)
        return {"format": LOG_FORMAT, "version": VERSION,
                "key": None if self.key is None else self.key.to_dict(),
                "dim": self.dim, "limits": self.limits.to_dict(), "space": self.space.to_dict(),
                "rules": None if self.rules is None else self.rules.to_dict(),
                "from_cache": self.from_cache, "trials": trials,
                "best": None if best is None else best.to_dict(), "best_latency_ms": lat,
                "truncated": bool(self.search is not None and self.search.truncated),
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def write_log(self, path: str | os.PathLike) -> None:
        atomic_write_json(path, self.log_dict())

    def summary(self) -> dict:
        """Small JSON-safe summary for training metrics."""
        best = self.best
        return {"done": self.done, "from_cache": self.from_cache,
                "search_iterations": self.search_iterations,
                "best": None if best is None else best.to_dict(),
                "best_latency_ms": self.log_dict()["best_latency_ms"],
                "steady_median_ms": statistics.median(self.steady) if self.steady else None}

    def state_dict(self) -> dict:
        """JSON-safe state for checkpoints (train.py's `tuner` dict): the trials so far."""
        return {"version": 1, "enabled": self.enabled, "from_cache": self.from_cache,
                "best": None if self._best is None else self._best.to_dict(),
                "trials": [] if self.search is None else [t.to_dict() for t in self.search.trials]}

    def load_state_dict(self, state: dict) -> None:
        """Resume: replay the recorded trials (the search is deterministic) and apply the
        configuration the search is at (its first iteration is a warmup again)."""
        if not state or not self.enabled:
            return
        if state.get("from_cache") and state.get("best") is not None:
            self.search, self.from_cache = None, True
            self._best = TuneConfig.from_dict(state["best"])
            self._switch(self._best)
            return
        self.from_cache = False
        self._best = None
        self._new_search()
        self.search.replay([Trial.from_dict(t) for t in state.get("trials", [])])
        nxt = self.search.next_config()
        self.current = None  # executors are new after a restart: apply and warm up again
        if nxt is None:
            self._best = self.search.best
            self._switch(self._best)
        else:
            self._switch(nxt)


class AggregationTimer:
    """Times every `dg.aggregate` call (forward and backward) of an iteration.

    CUDA: a pair of CUDA events around each call on the current stream, summed at `lap()`
    (one synchronize per iteration); CPU: time.perf_counter around each call.
    Attach by wrapping the instance's method (no change to DistGraph or the model):

        timer = AggregationTimer(dg)      # wraps dg.aggregate
        ... one training iteration ...
        ms = timer.lap()                  # aggregation ms of that iteration; resets
        timer.close()                     # unwraps
    """

    def __init__(self, dg: Any):
        self.dg = dg
        self.cuda = getattr(getattr(dg, "device", None), "type", "cpu") == "cuda"
        self._events: list[tuple[Any, Any]] = []
        self._cpu_ms = 0.0
        self._orig = dg.aggregate
        self.paused = False

        def timed(*args: Any, **kw: Any) -> Any:
            if self.paused:
                return self._orig(*args, **kw)
            if self.cuda:
                import torch

                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = self._orig(*args, **kw)
                b.record()
                self._events.append((a, b))
                return out
            t0 = time.perf_counter()
            out = self._orig(*args, **kw)
            self._cpu_ms += (time.perf_counter() - t0) * 1e3
            return out

        dg.aggregate = timed

    def lap(self) -> float:
        """Milliseconds spent in aggregate calls since the last lap (synchronizes on CUDA)."""
        if self.cuda and self._events:
            self._events[-1][1].synchronize()
            ms = sum(a.elapsed_time(b) for a, b in self._events)
        else:
            ms = self._cpu_ms
        self._events, self._cpu_ms = [], 0.0
        return float(ms)

    def close(self) -> None:
        """Restore dg.aggregate."""
        if self.dg.__dict__.get("aggregate") is not None:
            del self.dg.aggregate
