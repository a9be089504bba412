"""The runtime tuner: model (Eq. 1-3), the cross-iteration search on synthetic latency
landscapes, the plan cache and the training-loop driver."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from mgg.runtime import Communicator, PlanParams, build_plan
from mgg.graph import DistGraph, RuntimeConfig
from mgg.tuning import (AggregationTimer, AggregationTuner, CrossIterationSearch,
                        DeviceLimits, DistGraphApplier, PlanCache, PruneRules, SearchSpace,
                        TuneConfig, Workload, estimate, feasible, padded_dim, smem_bytes_for)
from mgg.tuning import model as model_mod

from mgg.testing.graphs import random_csr
from mgg.testing.tuning import GPU, Applied, convex, drive

L2 = np.log2


def run_search(search: CrossIterationSearch, latency, limit: int = 500) -> list[TuneConfig]:
    """Drive the ask/tell loop; every proposal must be allowed (feasible and not pruned)."""
    asked = []
    while (cfg := search.next_config()) is not None:
        assert search.allowed(cfg), f"proposed {cfg.label()}: {search.estimate(cfg).reason}"
        assert feasible(cfg, search.dim, search.limits)
        asked.append(cfg)
        search.report(cfg, latency(cfg))
        assert len(asked) <= limit, "the search did not terminate"
    assert search.done and search.next_config() is None
    return asked


def grid_optimum(space: SearchSpace, f, dim: int, limits: DeviceLimits) -> float:
    return min(f(c) for c in space.grid() if feasible(c, dim, limits))


def retreat_landscape(c: TuneConfig) -> float:
    """At wpb=1 the best ps is 16, but the optimum is (8, 2, 8): only the ps retreat finds it."""
    a, b, w = L2(c.ps), L2(c.dist), L2(c.wpb)
    return 2.0 + 0.06 * (a - 4 + 0.34 * w) ** 2 + 0.05 * (b - 1) ** 2 - 0.12 * w + 0.01 * w ** 2


# -- model -------------------------------------------------------------------------------------
def test_eq1_to_3_numbers():
    w = Workload(np.array([10, 3, 0, 33]), np.array([5, 5, 1]))
    assert w.partitions(4) == (3 + 1 + 9, 2 + 2 + 1)
    e = estimate(TuneConfig(4, 2, 3, variant="paper"), 130, GPU, w)
    assert e.wpw == 2 * 4 * 130 * 2
    assert padded_dim(130) == 132
    assert e.smem == 4 * 3 * 4 + 2 * 3 * 132 * 4 == smem_bytes_for(4, 3, 130, "paper")
    # the staged pipelined kernel keeps a whole remote partition per warp in flight
    assert estimate(TuneConfig(4, 2, 3), 130, GPU, w).smem == 3 * 4 * 132 * 4 == smem_bytes_for(4, 3, 130)
    assert e.num_warps == math.ceil(13 / 2) and e.num_blocks == math.ceil(7 / 3)
    assert e.blocks_per_sm == pytest.approx(3 / 132)
    assert e.threads_per_block == 96 and e.feasible


def test_feasibility_limits():
    small = DeviceLimits(8, 8192, 16384, 256, 1024, "tiny")
    assert feasible(TuneConfig(32, 1, 1, "paper"), 256, small)           # 128 + 2048 B
    assert not feasible(TuneConfig(1, 1, 4, "paper"), 256, small)        # 16 + 8192 > 8192
    assert not feasible(TuneConfig(1, 1, 16, "paper"), 8, small)         # 512 threads > 256
    assert "SMEM" in estimate(TuneConfig(1, 1, 4, "paper"), 256, small).reason
    with pytest.raises(ValueError, match="infeasible"):
        model_mod.check(TuneConfig(1, 1, 4, "paper"), 256, small)
    assert not feasible(TuneConfig(32, 1, 1), 256, small)                # pipelined: 32 rows of 1 KiB
    with pytest.raises(ValueError, match="no feasible configuration"):
        CrossIterationSearch(4096, small)


def test_workload_matches_real_plans():
    """Partition counts predicted from the row lengths equal those of the plan cut for each ps."""
    indptr, indices = random_csr(300, 4000, seed=3)
    bounds = np.array([0, 90, 200, 300])
    for rank in range(3):
        a, b = indptr[bounds[rank]], indptr[bounds[rank + 1]]
        rows = indptr[bounds[rank]: bounds[rank + 1] + 1] - a
        plan = build_plan(rows, indices[a:b], np.ones(b - a), None, bounds, rank,
                          PlanParams(1, 1, 1), node_of_pe=np.array([0, 0, 1]))
        w = Workload.from_plan(plan)
        assert w.has_inter  # every rank reads from the other node
        for ps, pi in [(1, None), (3, None), (8, 2), (32, 5)]:
            p = plan.with_params(PlanParams(ps, 4, 2, pi))
            assert w.partitions(ps, pi) == (len(p.local_parts), len(p.remote_parts))
            e = estimate(TuneConfig(ps, 4, 2, ps_inter=pi), 64, GPU, w)
            assert (e.num_warps, e.num_blocks) == (p.num_warps, p.num_blocks)
        t = Workload.from_table(w.table([1, 8], [None, 2]), w.has_inter)
        assert t.partitions(8, 2) == w.partitions(8, 2)


def test_workload_max_over_ranks_and_tables():
    a = Workload(np.array([10]), np.array([1, 1, 1]))
    b = Workload(np.array([2, 2]), np.array([40]))
    m = a.max_with(b)
    assert m.partitions(1) == (10, 40) and m.partitions(4) == (3, 10)
    t = Workload.max_tables([a.table([1, 4]), b.table([1, 4])])
    assert Workload.from_table(t).partitions(4) == (3, 10)


def test_prune_rules():
    tiny = Workload(np.full(50, 8), np.full(50, 8))  # 50 rows of 8 neighbours each side
    rules = PruneRules()
    # ps=1: 400 partitions -> 400 warps >= 132 SMs: allowed; ps=8, dist=1: 50 warps < 132: pruned
    assert estimate(TuneConfig(1, 1, 1), 64, GPU, tiny, rules).reason == ""
    assert "warps" in estimate(TuneConfig(8, 1, 1), 64, GPU, tiny, rules).reason
    # the smallest (ps, dist) is never pruned by R1 (nothing gives more warps)
    assert estimate(TuneConfig(1, 1, 1), 64, GPU, Workload(np.ones(3), np.ones(3)), rules).reason == ""
    # R2: 400 warps in blocks of 4 -> 100 blocks < 132 SMs <= 400 warps
    assert "blocks" in estimate(TuneConfig(1, 1, 4), 64, GPU, tiny, rules).reason
    assert "WPW" in estimate(TuneConfig(8, 4, 1), 64, GPU, None, PruneRules(max_wpw=1000)).reason
    # the search never walks into pruned configurations
    s = CrossIterationSearch(64, GPU, workload=tiny)
    run_search(s, convex)
    assert all(s.allowed(c) for c in s.table)


def test_device_limits_cpu_and_from_device(monkeypatch):
    cpu = DeviceLimits.cpu()
    assert cpu.name == "cpu" and cpu.num_sms >= 1
    assert DeviceLimits.from_dict(cpu.to_dict()) == cpu
    if not torch.cuda.is_available():
        assert DeviceLimits.detect() == cpu
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            DeviceLimits.from_device()
    props = types.SimpleNamespace(name="Fake GPU", multi_processor_count=7,
                                  shared_memory_per_block_optin=1000,
                                  shared_memory_per_multiprocessor=2000,
                                  max_threads_per_multi_processor=1536, max_threads_per_block=512)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    d = DeviceLimits.from_device()
    assert (d.num_sms, d.smem_per_block_optin, d.smem_per_sm, d.max_threads_per_block,
            d.max_threads_per_sm, d.name) == (7, 1000, 2000, 512, 1536, "Fake GPU")
    del props.max_threads_per_block  # torch has no such field: cupy must supply it
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="max_threads_per_block"):
            DeviceLimits.from_device(0)


# -- search ------------------------------------------------------------------------------------
def test_convex_finds_grid_optimum():
    s = CrossIterationSearch(128, GPU)
    asked = run_search(s, convex)
    opt = grid_optimum(s.space, convex, 128, GPU)
    assert convex(s.best) <= 1.05 * opt
    assert len(asked) <= 25
    assert asked[0] == TuneConfig(1, 1, 1)
    phases = [t.phase for t in s.trials]
    assert phases.index("dist") > phases.index("ps") and phases.index("wpb") > phases.index("dist")


def test_retreat_finds_what_greedy_misses():
    s = CrossIterationSearch(128, GPU, SearchSpace(max_trials=24))
    run_search(s, retreat_landscape)
    opt_cfg = min(s.space.grid(), key=retreat_landscape)
    assert opt_cfg.ps < 16 and opt_cfg.wpb > 1
    greedy = [t for t in s.trials if t.phase in ("ps", "dist", "wpb")]
    greedy_best = min(retreat_landscape(t.config) for t in greedy)
    assert any(t.phase == "retreat" for t in s.trials)
    assert retreat_landscape(s.best) < greedy_best
    assert retreat_landscape(s.best) <= 1.05 * retreat_landscape(opt_cfg)


@pytest.mark.parametrize("seed", range(8))
def test_noisy_within_5_percent_in_12(seed):
    """1% multiplicative noise (the spread of repeated aggregation timings on H200 was 0.3-1.6%):
    within 5% of the grid optimum in at most 12 measurements."""
    rng = np.random.default_rng(seed)
    s = CrossIterationSearch(128, GPU)
    asked = run_search(s, lambda c: convex(c) * (1 + 0.01 * rng.standard_normal()))
    assert convex(s.best) <= 1.05 * grid_optimum(s.space, convex, 128, GPU)
    assert len(asked) <= 12 == s.budget
    assert max(len(v) for v in s.table.values()) <= s.space.max_repeats
    assert s.best == min(s.table, key=s.latency)  # the lowest median is applied


def test_heavy_noise_with_median_of_three():
    """2% noise, each report the median of 3 iterations (the driver's `repeats=3`): over 50 runs
    at least 90% land within 5% of the optimum and none beyond 10%."""
    ratios = []
    for seed in range(50):
        rng = np.random.default_rng(1000 + seed)
        s = CrossIterationSearch(128, GPU)
        run_search(s, lambda c: float(np.median(convex(c) * (1 + 0.02 * rng.standard_normal(3)))))
        ratios.append(convex(s.best) / grid_optimum(s.space, convex, 128, GPU))
    ratios = np.array(ratios)
    assert (ratios <= 1.05).mean() >= 0.9 and ratios.max() <= 1.10


def test_remeasure_inside_noise_band():
    """Two configs within the band are asked again; their medians decide."""
    vals = {TuneConfig(1, 1, 1): iter([1.00, 1.00, 1.00]), TuneConfig(2, 1, 1): iter([0.99, 1.2, 1.3])}
    s = CrossIterationSearch(8, GPU, SearchSpace(ps_values=(1, 2), dist_values=(1,), wpb_values=(1,)))
    asked = run_search(s, lambda c: next(vals[c]))
    assert asked.count(TuneConfig(2, 1, 1)) >= 2
    assert s.best == TuneConfig(1, 1, 1)


def test_plateau_terminates_quickly():
    s = CrossIterationSearch(64, GPU)
    asked = run_search(s, lambda c: 5.0)
    assert len(asked) <= 45 and s.best == TuneConfig(1, 1, 1)
    # a flat stretch (ps 1..2) before a drop is crossed: a stable tie is not an increase
    s1 = CrossIterationSearch(64, GPU)
    asked1 = run_search(s1, lambda c: (3.0 if c.ps < 4 else 2.0) + 0.01 * L2(c.dist))
    assert len(asked1) <= 45 and s1.best.ps >= 4
    # a noisy flat bottom (every ps >= 4, dist >= 2 within 1%) terminates near the bottom
    for seed in range(4):
        rng = np.random.default_rng(seed)

        def f(c):
            return (1.0 + 0.2 * max(0, 2 - L2(c.ps)) + 0.1 * max(0, 1 - L2(c.dist))
                    + 0.05 * L2(c.wpb)) * (1 + 0.005 * rng.standard_normal())

        s2 = CrossIterationSearch(64, GPU)
        asked2 = run_search(s2, f)
        assert len(asked2) <= 40
        assert s2.best.ps >= 4 and s2.best.dist >= 2 and s2.best.wpb == 1


def test_infeasible_region_never_proposed():
    small = DeviceLimits(16, 8192, 65536, 1024, 2048, "small-smem")
    dim = 256  # paper (Eq. 1): smem = 4*ps*wpb + 2048*wpb: wpb <= 3 fits, so wpb in {1, 2}

    def lat(c: TuneConfig) -> float:
        assert feasible(c, dim, small), f"launched infeasible {c.label()}"
        return 1.0 + 0.05 * (L2(c.ps) - 4) ** 2 + 0.05 * (L2(c.dist) - 1) ** 2 + 0.1 * (L2(c.wpb) - 3) ** 2

    s = CrossIterationSearch(dim, small, SearchSpace(variants=("paper",)))
    run_search(s, lat)
    assert s.best.wpb == 2
    assert lat(s.best) <= 1.05 * grid_optimum(s.space, lat, dim, small)


def test_variants_are_a_dimension():
    def lat(c):
        return convex(c) * {"pipelined": 1.0, "ptr": 0.8, "halo": 1.3}[c.variant]

    s = CrossIterationSearch(128, GPU, SearchSpace(variants=("pipelined", "ptr", "halo")))
    run_search(s, lat)
    assert s.best.variant == "ptr"
    v = [t for t in s.trials if t.phase == "variant"]
    assert {t.config.variant for t in v} == {"ptr", "halo"}
    assert len({(t.config.ps, t.config.dist, t.config.wpb) for t in v}) == 1


def test_ps_inter_phase_with_nodes():
    w = Workload(np.full(5000, 40), np.full(5000, 20), np.full(5000, 30))
    assert w.has_inter

    def lat(c):
        pi = c.ps if c.ps_inter is None else c.ps_inter
        return convex(c) + 0.05 * (L2(pi) - 1) ** 2

    s = CrossIterationSearch(64, GPU, workload=w)
    run_search(s, lat)
    assert any(t.phase == "ps_inter" for t in s.trials)
    assert s.best.ps_inter is not None and s.best.ps_inter < s.best.ps
    s0 = CrossIterationSearch(64, GPU, workload=Workload(np.full(5000, 40), np.full(5000, 20)))
    run_search(s0, lat)
    assert not any(t.phase == "ps_inter" for t in s0.trials)


def test_max_trials_cap_and_protocol_errors():
    s = CrossIterationSearch(64, GPU, SearchSpace(max_trials=5))
    asked = run_search(s, convex)
    assert len(asked) <= 5 and s.truncated
    s = CrossIterationSearch(64, GPU, SearchSpace(max_trials=5, variants=("pipelined", "halo")))
    asked = run_search(s, convex)
    assert len(asked) <= 6 == s.budget and s.truncated and asked[-1].variant == "halo"
    with pytest.raises(RuntimeError):
        s.report(asked[0], 1.0)
    s = CrossIterationSearch(64, GPU)
    with pytest.raises(ValueError, match="asked for"):
        s.report(TuneConfig(2, 2, 2), 1.0)
    with pytest.raises(ValueError, match="positive"):
        s.report(s.next_config(), float("nan"))


# -- plan cache --------------------------------------------------------------------------------
def _plan(ps=1):
    indptr, indices = random_csr(200, 3000, seed=5)
    bounds = np.array([0, 70, 200])
    a, b = indptr[0], indptr[70]
    return build_plan(indptr[:71] - a, indices[a:b], np.ones(b - a), None, bounds, 0, PlanParams(ps, 1, 1))


def test_plan_cache_equals_with_params_and_evicts():
    base = _plan()
    cache = PlanCache(capacity=2)
    for ps, dist, wpb in [(4, 2, 2), (8, 1, 4), (4, 8, 1), (16, 2, 2), (4, 2, 2)]:
        params = PlanParams(ps, dist, wpb)
        got = cache.get("gcn", base, params)
        ref = base.with_params(params)
        for f in ("local_parts", "remote_parts", "remote_part_inter", "warps"):
            np.testing.assert_array_equal(getattr(got, f), getattr(ref, f))
        assert (got.ps, got.dist, got.wpb) == (ps, dist, wpb)
        assert got.local_indices is base.local_indices  # the split is shared, not copied
        assert len(cache) <= 2
    assert cache.hits >= 1 and (4, 4) in cache.ps_values()


def test_distgraph_applier_and_timer():
    indptr, indices = random_csr(120, 1500, seed=2)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(1, 1, 1, backend="cpu")) as dg:
        x = torch.randn(dg.n_local, 8)
        ref = dg.aggregate(x, "gcn").clone()
        ap = DistGraphApplier(dg)
        ap(TuneConfig(8, 4, 2, variant="ptr"))
        assert dg.params == PlanParams(8, 4, 2) and dg.config.variant == "ptr"
        assert dg.plan("gcn").ps == 8 and dg.plan("gcn").num_warps == dg.plan("gcn").warps.shape[0]
        timer = AggregationTimer(dg)
        torch.testing.assert_close(dg.aggregate(x, "gcn"), ref)
        assert timer.lap() > 0 and timer.lap() == 0
        timer.close()
        assert "aggregate" not in dg.__dict__


# -- driver ------------------------------------------------------------------------------------
def test_driver_warmup_and_finish():
    ap = Applied()
    t = AggregationTuner(ap, 128, GPU, warmup=2)
    assert ap.current == TuneConfig(1, 1, 1)
    seen = []
    slow_first = {}

    def f(c):  # the first iteration after a switch is slow (executor build): must be skipped
        n = slow_first.get(c, 0)
        slow_first[c] = n + 1
        seen.append(c)
        return convex(c) * (50 if n == 0 and len(seen) > 0 and seen[-2:-1] != [c] else 1)

    drive(t, ap, f, 200)
    assert t.done and ap.current == t.best
    assert convex(t.best) <= 1.05 * grid_optimum(SearchSpace(), convex, 128, GPU)
    assert all(tr.latency_ms < 10 for tr in t.search.trials)  # warmup iterations never reported
    assert len(t.steady) > 0 and t.summary()["search_iterations"] == len(t.search.trials)


def test_driver_resume_replays_state():
    ap1 = Applied()
    t1 = AggregationTuner(ap1, 128, GPU)
    drive(t1, ap1, convex, 9)
    state = t1.state_dict()
    ap2 = Applied()
    t2 = AggregationTuner(ap2, 128, GPU)
    t2.load_state_dict(state)
    assert ap2.current == ap1.current
    drive(t1, ap1, convex, 100)
    drive(t2, ap2, convex, 100)
    assert t1.best == t2.best and [x.config for x in t1.search.trials] == [x.config for x in t2.search.trials]


class FakeComm:
    """Two ranks' view from rank 1: allreduce max with a slower peer, bcast from 'rank 0'."""

    rank, size = 1, 2

    def __init__(self):
        self.reduced = 0

    def allreduce_scalar(self, v, op="sum"):
        assert op == "max"
        self.reduced += 1
        return max(v, 1.5 * v)

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        return [obj, obj]


def test_driver_reduces_latency_over_ranks(tmp_path):
    comm = FakeComm()
    ap = Applied()
    t = AggregationTuner(ap, 128, GPU, comm=comm, cache_path=tmp_path / "c.json",
                         key=model_key(), log_path=tmp_path / "log.json")
    drive(t, ap, convex, 100)
    assert comm.reduced == len(t.search.trials)
    assert t.search.trials[0].latency_ms == pytest.approx(1.5 * convex(TuneConfig(1, 1, 1)))
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "log.json").exists()  # rank 1


def model_key():
    from mgg.tuning import TuneKey

    return TuneKey("fp", 2, 128, GPU.name, "k1")


def test_disabled_tuner_is_inert():
    ap = Applied()
    t = AggregationTuner(ap, 128, GPU, enabled=False)
    assert ap.calls == [] and t.done and t.step(1.0) is None and t.best is None
