"""Plans per ps: the neighbor-partition cut depends on ps (and ps_inter) only, the warp worklist
on dist, and wpb on nothing in the plan. `PlanCache` keeps the cuts of the last few ps values
(LRU) so that switching back to a ps the tuner already visited costs no re-cut, and frees the
cuts of ps values it has not used for a while. `DistGraph` owns one (`dg.plan_cache`); the
runtime tuner's `DistGraphApplier` (mgg.tuning.plancache) switches it.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Hashable, Mapping

import numpy as np

from .plan import AggregationPlan, PlanParams, cut_partitions, cut_remote, warp_worklist

__all__ = ["PlanCache"]

_Cut = tuple[np.ndarray, np.ndarray, np.ndarray]  # local_parts [Lp,3], remote_parts [Rp,3], inter [Rp]


class PlanCache:
    """LRU of partition cuts, per (ps, ps_inter) and per plan key (e.g. (kind, transposed)).

    Args:
        capacity: how many (ps, ps_inter) values to keep (each holds the cuts of every key).
    """

    def __init__(self, capacity: int = 3):
        if capacity < 1:
            raise ValueError("PlanCache capacity must be >= 1")
        self.capacity = int(capacity)
        self._cuts: OrderedDict[tuple[int, int], dict[Hashable, _Cut]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._cuts)

    def ps_values(self) -> list[tuple[int, int]]:
        """The cached (ps, ps_inter) values, least recently used first."""
        return list(self._cuts)

    def clear(self) -> None:
        """Forget every cut."""
        self._cuts.clear()

    def keep(self, plans: Mapping[Hashable, AggregationPlan]) -> None:
        """Remember the cuts `plans` already have (before their owner moves to another ps)."""
        for key, p in plans.items():
            ck = (int(p.ps), int(p.ps_inter or p.ps))
            self._remember(ck, key, (p.local_parts, p.remote_parts, p.remote_part_inter))

    def _remember(self, ck: tuple[int, int], key: Hashable, cut: _Cut) -> None:
        self._cuts.setdefault(ck, {})[key] = cut
        self._cuts.move_to_end(ck)
        while len(self._cuts) > self.capacity:
            self._cuts.popitem(last=False)  # the arrays go with the last reference

    def get(self, key: Hashable, base: AggregationPlan, params: PlanParams) -> AggregationPlan:
        """`base` re-cut for `params` (any plan of `key` will do as base: the split is the same).

        Returns a plan sharing base's CSR arrays, with the cached or a fresh partition cut and
        a worklist for params.dist.
        """
        ck = (int(params.ps), int(params.inter_ps))
        have = (int(base.ps), int(base.ps_inter or base.ps))
        cut = self._cuts.get(ck, {}).get(key)
        if cut is None and ck == have:  # base is already cut this way
            cut = (base.local_parts, base.remote_parts, base.remote_part_inter)
            self.hits += 1
        elif cut is None:
            self.misses += 1
            lp = cut_partitions(base.local_indptr, ck[0])
            rp, inter = cut_remote(base.remote_indptr, base.remote_split, ck[0], ck[1])
            cut = (lp, rp, inter)
        else:
            self.hits += 1
        self._remember(ck, key, cut)
        lp, rp, inter = cut
        warps = base.warps if (ck == have and base.dist == params.dist) else \
            warp_worklist(len(lp), len(rp), params.dist)
        return dataclasses.replace(base, ps=ck[0], ps_inter=ck[1], dist=int(params.dist),
                                   wpb=int(params.wpb), local_parts=lp, remote_parts=rp,
                                   remote_part_inter=inter, warps=warps)

    def apply(self, plans: Mapping[Hashable, AggregationPlan], params: PlanParams
              ) -> dict[Hashable, AggregationPlan]:
        """Every plan of `plans` re-cut for `params` (the DistGraph.set_params operation)."""
        return {k: self.get(k, p, params) for k, p in plans.items()}
