"""`DistGraphApplier`: puts a tuner configuration into effect on a DistGraph.

`PlanCache` (the per-ps cuts a DistGraph keeps) lives in the runtime core, mgg.runtime.plancache,
and is re-exported here.
"""
from __future__ import annotations

from typing import Any

from ..runtime.plan import PlanParams
from ..runtime.plancache import PlanCache

__all__ = ["PlanCache", "DistGraphApplier"]


class DistGraphApplier:
    """Applies a TuneConfig to a DistGraph: plan knobs and kernel variant, through
    `DistGraph.set_config` (the DistGraph keeps the per-ps cuts and recent executors).

    Args:
        dg: the DistGraph (anything with `set_config(params, variant)`).
        plan_cache: installed as `dg.plan_cache` (e.g. another capacity); None keeps dg's own.

    `TuneConfig.ps_inter` None keeps the DistGraph's own ps_inter setting (--ps-inter).
    """

    def __init__(self, dg: Any, plan_cache: PlanCache | None = None):
        self.dg = dg
        if plan_cache is not None:
            dg.plan_cache = plan_cache
        self.user_ps_inter = getattr(getattr(dg, "config", None), "ps_inter", None)

    @property
    def plan_cache(self) -> PlanCache | None:
        return getattr(self.dg, "plan_cache", None)

    def params_for(self, cfg: Any) -> PlanParams:
        pi = self.user_ps_inter if cfg.ps_inter is None else cfg.ps_inter
        return PlanParams(int(cfg.ps), int(cfg.dist), int(cfg.wpb), pi)

    def __call__(self, cfg: Any) -> None:
        self.dg.set_config(self.params_for(cfg), variant=cfg.variant)
        prepare = getattr(self.dg, "prepare", None)
        if prepare is not None:
            prepare()  # plans are re-cut and executors built here, not inside the timed iteration

    def release(self) -> None:
        """The search is over: free the cuts and executors of the other configurations."""
        release = getattr(self.dg, "release_unused", None)
        if release is not None:
            release()
