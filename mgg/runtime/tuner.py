"""Runtime tuner (MGG §6): `from mgg.runtime.tuner import AggregationTuner, ...`.

The implementation lives in the small modules of `mgg.runtime.tuning`:

* `model`     -- Eq. 1-3, `DeviceLimits`, `Workload`, feasibility and pruning rules;
* `search`    -- `CrossIterationSearch`, the ask/tell cross-iteration heuristic;
* `plancache` -- `PlanCache` (plans per ps, LRU) and `DistGraphApplier`;
* `cache`     -- the persisted `TuningCache` (JSON, atomic) and the tuning-log format;
* `driver`    -- `AggregationTuner` (one `step(latency_ms)` per training iteration) and
                 `AggregationTimer` (CUDA events / perf_counter around `dg.aggregate`).

See docs/tuner.md.
"""
from .tuning import *  # noqa: F401,F403
from .tuning import __all__  # noqa: F401
