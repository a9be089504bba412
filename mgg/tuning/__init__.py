"""The runtime tuner: MGG §6's analytical model and cross-iteration search, plus a per-ps plan
cache, a persisted tuning cache and the training-loop driver. See docs/tuner.md."""
from .cache import (CacheEntry, TuneKey, TuningCache, atomic_write_json, kernel_version,
                    read_log)
from .driver import AggregationTimer, AggregationTuner, distgraph_workload
from .model import (DeviceLimits, Estimate, PruneRules, TuneConfig, Workload, check, estimate,
                    feasible, padded_dim, smem_bytes_for)
from .plancache import DistGraphApplier, PlanCache
from .search import CrossIterationSearch, SearchSpace, Trial

__all__ = ["CacheEntry", "TuneKey", "TuningCache", "atomic_write_json", "kernel_version",
           "read_log", "AggregationTimer", "AggregationTuner", "distgraph_workload",
           "DeviceLimits", "Estimate", "PruneRules", "TuneConfig", "Workload", "check", "estimate",
           "feasible", "padded_dim", "smem_bytes_for", "DistGraphApplier", "PlanCache",
           "CrossIterationSearch", "SearchSpace", "Trial"]
