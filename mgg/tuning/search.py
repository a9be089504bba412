"""MGG §6 cross-iteration heuristic search as an ask/tell state machine.

Each training iteration measures one configuration:

    search = CrossIterationSearch(dim=602, limits=DeviceLimits.from_device(), workload=w)
    while (cfg := search.next_config()) is not None:
        latency_ms = run_one_iteration_with(cfg)
        search.report(cfg, latency_ms)
    best = search.best

The order is the paper's (and `docs/tuner.md`):

1. start at ps = dist = wpb = the smallest grid value (1);
2. grow ps along its grid while the latency falls; then dist; then wpb;
3. when growing wpb hurts, *retreat* ps to its second-best value below the current one (the best
   ps of step 2 that is smaller) and grow wpb again from there; stop when neither that ps
   decrease nor a wpb increase beats the top-3 latencies in the lookup table;
4. beyond the paper: with nodes, grow ps_inter *down* from ps while that helps; then try every
   other kernel variant at the best (ps, dist, wpb) found (the variants share the plan and the
   knobs, so the knobs found for the default kernel are the natural start and one iteration per
   variant is enough to rank them);
5. confirm: when the pick and the runner-up are within the noise band, both are measured again
   (so a single lucky measurement does not win) and the medians decide.

Budget: the whole search takes at most `SearchSpace.budget` measurements: `max_trials` (12, the
paper's "within 12 iterations") for steps 1-3 and 5, plus one per extra variant and the ps_inter
steps when those dimensions are on. Steps 1-3 stop early when only the confirm reserve is left.

Noise: every configuration is measured once while the search moves (each measurement is the
median of the driver's `repeats` iterations). Along an axis the search keeps the best value seen;
a step that is lower moves on, a step that is *clearly* higher (more than `noise_band`, relative)
stops, and a step within the band (a tie) moves on at most `patience` times in a row -- so a flat
stretch before a drop is crossed but a plateau ends the axis. Every measurement goes into the
lookup table (config -> list of latencies); `best` is the configuration with the lowest median.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Generator, Sequence

from ..knobs import KNOB_RANGES
from .model import DeviceLimits, Estimate, PruneRules, TuneConfig, Workload, estimate

__all__ = ["SearchSpace", "Trial", "CrossIterationSearch"]

PS_VALUES = (1, 2, 4, 8, 16, 32)     # paper: ps in [1..32]
DIST_VALUES = (1, 2, 4, 8, 16)       # paper: dist in [1..16]
WPB_VALUES = (1, 2, 4, 8, 16)        # paper: wpb in [1..16]


@dataclass(frozen=True)
class SearchSpace:
    """The grid and the search's knobs. Growth steps double (the grids are powers of two)."""

    ps_values: tuple[int, ...] = PS_VALUES
    dist_values: tuple[int, ...] = DIST_VALUES
    wpb_values: tuple[int, ...] = WPB_VALUES
    variants: tuple[str, ...] = ("pipelined",)
    tune_ps_inter: bool | None = None   # None: only when the workload has other-node neighbors
    noise_band: float = 0.03            # relative difference below which two latencies tie
    max_repeats: int = 3                # measurements of one config at most (median of them)
    top_k: int = 3                      # the retreat stops unless it beats the top-k latencies
    max_trials: int = 12                # measurements for ps/dist/wpb (+ retreat and confirm)
    patience: int = 1                   # ties in a row an axis crosses before it stops

    def __post_init__(self) -> None:
        for name in ("ps_values", "dist_values", "wpb_values"):
            v = tuple(int(x) for x in getattr(self, name))
            lo, hi = KNOB_RANGES[name[:-len("_values")]]
            if not v or list(v) != sorted(set(v)) or v[0] < lo or v[-1] > hi:
                raise ValueError(f"SearchSpace.{name} must be increasing integers in [{lo}, {hi}], got {v}")
            object.__setattr__(self, name, v)
        if not self.variants:
            raise ValueError("SearchSpace.variants must name at least one kernel variant")
        object.__setattr__(self, "variants", tuple(str(v) for v in self.variants))
        if not 0 <= self.noise_band < 1 or self.max_repeats < 1 or self.top_k < 1 or self.max_trials < 1:
            raise ValueError("SearchSpace: noise_band in [0, 1), max_repeats/top_k/max_trials >= 1")
        if self.patience < 0:
            raise ValueError("SearchSpace.patience must be >= 0")

    def budget(self, with_inter: bool = False) -> int:
        """Measurements the whole search may take: max_trials + one per extra variant + the
        ps_inter steps (when that phase runs)."""
        extra = len(self.variants) - 1
        if with_inter:
            extra += len(self.ps_values) - 1
        return self.max_trials + extra

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SearchSpace":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("ps_values", "dist_values", "wpb_values", "variants"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def grid(self, variant: str | None = None) -> list[TuneConfig]:
        """Every (ps, dist, wpb) of the grid for one variant (default: the first)."""
        v = self.variants[0] if variant is None else variant
        return [TuneConfig(p, d, w, v) for p in self.ps_values for d in self.dist_values
                for w in self.wpb_values]


@dataclass(frozen=True)
class Trial:
    """One measurement: the step it was taken at, the config, its latency and the search phase."""

    step: int
    config: TuneConfig
    latency_ms: float
    phase: str

    def to_dict(self) -> dict:
        return {"step": self.step, **self.config.to_dict(), "latency_ms": self.latency_ms,
                "phase": self.phase}

    @classmethod
    def from_dict(cls, d: dict) -> "Trial":
        return cls(int(d["step"]), TuneConfig.from_dict(d), float(d["latency_ms"]), str(d["phase"]))


_Gen = Generator[TuneConfig, None, None]


class CrossIterationSearch:
    """Ask/tell search over (ps, dist, wpb[, ps_inter], variant).

    Args:
        dim: the largest embedding width D any aggregation of the run sees (smem grows with D).
        limits: hardware limits; configurations that do not fit are never proposed.
        space: grid and knobs.
        workload: partition counts per ps (for Eq. 2-3 and the pruning rules); None: only the
            hard feasibility constraints apply.
        rules: pruning rules (None: none, feasibility only).
    """

    def __init__(self, dim: int, limits: DeviceLimits, space: SearchSpace | None = None,
                 workload: Workload | None = None, rules: PruneRules | None = PruneRules()):
        self.dim = int(dim)
        self.limits = limits
        self.space = space or SearchSpace()
        self.workload = workload
        self.rules = rules
        self.table: dict[TuneConfig, list[float]] = {}
        self.trials: list[Trial] = []
        self.truncated = False  # True when the budget cut a phase short
        self._phase = "ps"
        self._pending: TuneConfig | None = None
        self._done = False
        s = self.space
        self.start = TuneConfig(s.ps_values[0], s.dist_values[0], s.wpb_values[0], s.variants[0])
        if not self.estimate(self.start).feasible:
            raise ValueError(f"no feasible configuration: the smallest one ({self.start.label()}) "
                             f"does not fit at D={dim} on {limits.name}: {self.estimate(self.start).reason}")
        inter = self.space.tune_ps_inter
        if inter is None:
            inter = self.workload is not None and self.workload.has_inter
        self.tune_inter = bool(inter)
        self.budget = self.space.budget(self.tune_inter)
        self._gen = self._run()
        self._advance()

    # -- ask / tell ----------------------------------------------------------------------------
    def next_config(self) -> TuneConfig | None:
        """The configuration to measure next (the same until it is reported); None when done."""
        return self._pending

    def report(self, config: TuneConfig, latency_ms: float) -> None:
        """Record the latency (ms) of one iteration run with `config` (must be `next_config()`)."""
        if self._pending is None:
            raise RuntimeError("the search is finished; use .best")
        if config != self._pending:
            raise ValueError(f"reported {config.label()} but the search asked for {self._pending.label()}")
        lat = float(latency_ms)
        if not math.isfinite(lat) or lat <= 0:
            raise ValueError(f"latency must be a positive finite number of ms, got {latency_ms!r}")
        self.table.setdefault(config, []).append(lat)
        self.trials.append(Trial(len(self.trials), config, lat, self._phase))
        self._advance()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def phase(self) -> str:
        return "done" if self._done else self._phase

    @property
    def best(self) -> TuneConfig:
        """The configuration with the lowest median latency so far (the start before any)."""
        if not self.table:
            return self.start
        return min(self.table, key=lambda c: (self.latency(c), c.sort_key()))

    def latency(self, cfg: TuneConfig) -> float:
        """Median latency measured for `cfg` (inf when never measured)."""
        v = self.table.get(cfg)
        return statistics.median(v) if v else math.inf

    def estimate(self, cfg: TuneConfig) -> Estimate:
        s = self.space
        return estimate(cfg, self.dim, self.limits, self.workload, self.rules,
                        min_ps=s.ps_values[0], min_dist=s.dist_values[0])

    def allowed(self, cfg: TuneConfig) -> bool:
        """Feasible and not pruned by the model."""
        return self.estimate(cfg).reason == ""

    def replay(self, trials: Sequence[Trial]) -> None:
        """Feed recorded trials back in order (resume from a checkpoint): the search is
        deterministic, so it reaches the same state. Raises ValueError when they disagree."""
        for t in trials:
            self.report(t.config, t.latency_ms)

    # -- the state machine ---------------------------------------------------------------------
    def _advance(self) -> None:
        if len(self.trials) >= self.budget:
            self.truncated = self.truncated or not self._done
            self._gen.close()
            self._pending, self._done = None, True
            return
        try:
            self._pending = next(self._gen)
        except StopIteration:
            self._pending, self._done = None, True

    def _n(self, cfg: TuneConfig) -> int:
        return len(self.table.get(cfg, ()))

    def _ensure(self, cfg: TuneConfig) -> _Gen:
        if self._n(cfg) == 0:
            yield cfg

    def _step(self, cfg: TuneConfig, axis: str, direction: int = 1) -> TuneConfig | None:
        """The neighbour of cfg one grid step along `axis` (ps/dist/wpb/ps_inter), or None."""
        if axis == "ps_inter":
            cur = cfg.ps if cfg.ps_inter is None else cfg.ps_inter
            vals = [v for v in self.space.ps_values if v <= cfg.ps]
        else:
            cur = getattr(cfg, axis)
            vals = list(getattr(self.space, f"{axis}_values"))
        if cur not in vals:
            return None
        i = vals.index(cur) + direction
        if not 0 <= i < len(vals):
            return None
        return replace(cfg, **{axis: vals[i]})

    def _left(self) -> int:
        """Measurements left to the knob phases (the extra dimensions and the confirm reserve
        are kept back)."""
        reserve = self.budget - self.space.max_trials + (1 if self.space.max_trials > 1 else 0)
        return self.budget - reserve - len(self.trials)

    def _tie(self, a: float, b: float) -> bool:
        return abs(a - b) <= self.space.noise_band * min(a, b)

    def _grow(self, cur: TuneConfig, axis: str, direction: int = 1) -> Generator[TuneConfig, None, TuneConfig]:
        """Move along `axis` while the latency falls (the paper stops when growing "would also
        increase the latency"); return the best value seen on the axis. A clearly higher step
        stops; a tie within the noise band moves on at most `patience` times in a row."""
        yield from self._ensure(cur)
        best, ties, pos = cur, 0, cur
        while True:
            if self._left() <= 0:
                self.truncated = True   # the budget, not the landscape, ended this axis
                break
            nxt = self._step(pos, axis, direction)
            if nxt is None or not self.allowed(nxt):
                break
            yield from self._ensure(nxt)
            lb, ln = self.latency(best), self.latency(nxt)
            if ln < lb and not self._tie(ln, lb):
                best, ties = nxt, 0
            elif self._tie(ln, lb):
                if ln < lb:
                    best = nxt
                ties += 1
                if ties > self.space.patience:
                    break
            else:
                break
            pos = nxt
        return best

    def _threshold(self, variant: str) -> float:
        lats = sorted(self.latency(c) for c in self.table if c.variant == variant)
        k = self.space.top_k
        return lats[k - 1] if len(lats) >= k else math.inf

    def _retreat_ps(self, cur: TuneConfig, ps_latency: dict[int, float]) -> int | None:
        """ps's second-best value: the best ps of the ps phase below cur.ps (else one step down)."""
        lower = {p: t for p, t in ps_latency.items() if p < cur.ps}
        if lower:
            return min(lower, key=lambda p: (lower[p], -p))
        step = self._step(cur, "ps", -1)
        return None if step is None else step.ps

    def _run(self) -> _Gen:
        s = self.space
        base = s.variants[0]
        cur = self.start
        # 1-2: ps, then dist, then wpb
        self._phase = "ps"
        cur = yield from self._grow(cur, "ps")
        ps_latency = {c.ps: self.latency(c) for c in self.table
                      if c.dist == self.start.dist and c.wpb == self.start.wpb and c.variant == base}
        self._phase = "dist"
        cur = yield from self._grow(cur, "dist")
        self._phase = "wpb"
        cur = yield from self._grow(cur, "wpb")
        # 3: retreat ps and grow wpb again while that enters the top-k
        while self._left() > 0:
            self._phase = "retreat"
            lower = self._retreat_ps(cur, ps_latency)
            if lower is None:
                break
            threshold = self._threshold(base)
            c1 = replace(cur, ps=lower)
            c2 = self._step(c1, "wpb")
            cands = [c for c in (c1, c2) if c is not None and self.allowed(c)]
            for c in cands:
                if self._left() > 0:
                    yield from self._ensure(c)
            cands = [c for c in cands if self._n(c)]
            if not cands:
                break
            pick = min(cands, key=lambda c: (self.latency(c), c.sort_key()))
            if not self.latency(pick) < threshold:
                break
            cur = yield from self._grow(pick, "wpb")
            ps_latency = {p: t for p, t in ps_latency.items() if p < cur.ps}
        cur = self.best
        # 4a: ps_inter (multi-node plans only, unless forced)
        if self.tune_inter:
            self._phase = "ps_inter"
            cur = yield from self._grow_extra(cur)
            cur = self.best
        # 4b: the other kernel variants at the best knobs
        self._phase = "variant"
        for v in s.variants[1:]:
            c = replace(cur, variant=v)
            if self.allowed(c):
                yield from self._ensure(c)
        # 5: confirm: a pick within the noise band of the runner-up is measured again (with the
        # runner-up) while the budget lasts; the medians decide
        self._phase = "confirm"
        for _ in range(s.max_repeats - 1):
            ranked = sorted(self.table, key=lambda c: (self.latency(c), c.sort_key()))
            if len(ranked) < 2 or not self._tie(self.latency(ranked[0]), self.latency(ranked[1])):
                break
            a, b = ranked[0], ranked[1]
            if self._n(a) >= s.max_repeats:
                break
            if len(self.trials) >= self.budget:
                break
            yield a
            if (len(self.trials) < self.budget and self.best == a and self._n(b) < self._n(a)
                    and self._tie(self.latency(a), self.latency(b))):
                yield b

    def _grow_extra(self, cur: TuneConfig) -> Generator[TuneConfig, None, TuneConfig]:
        """ps_inter down from ps, one measurement per step, stopping at the first increase."""
        best = cur
        while True:
            nxt = self._step(best, "ps_inter", -1)
            if nxt is None or not self.allowed(nxt):
                return best
            yield from self._ensure(nxt)
            if not self.latency(nxt) < self.latency(best):
                return best
            best = nxt
