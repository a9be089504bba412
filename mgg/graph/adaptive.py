"""Degree-adaptive choice of the fused aggregation strategy, and the per-DistGraph fused executors.

fuseGNN (Chen et al., "fuseGNN: Accelerating Graph Convolutional Neural Network Training on
GPGPU", ICCAD 2020) runs aggregation in two abstractions and picks one by the graph's *average
degree*: edge-centric Gather-ApplyEdge-Scatter (GAS: edge-parallel, atomics) on graphs of low
average degree (their Cora 3.9, Citeseer 2.8, Pubmed 4.5), node-centric Gather-ApplyEdge-Reduce
(GAR: one thread block per target, on-chip reduction, no atomics) on graphs of high average degree
(their Reddit, 492); "empirically, one should select fused-GAR for graphs with high average
degree and fused-GAS for others". The paper gives no crossover number, only these two regimes.

mgg maps them onto its plans: ``node`` = one warp per target over its local and remote neighbor
partitions (online softmax in registers), ``edge`` = edge-parallel chunks with a segmented
reduction (see mgg/kernels/gat_cpu.py and gat_fused.cu). The rule, per rank, on the degree
statistics of its plan (local + remote CSR, the edges its targets read):

    node  if avg_degree >= NODE_CENTRIC_MIN_AVG_DEGREE and max_degree <= MAX_DEGREE_SKEW * avg_degree
    edge  otherwise

The statistics are those of the whole graph (`global_degree_stats`, collective), so every rank
picks the same executor (their exchanges differ). The threshold is per backend
(`threshold_for`): on the GPU it was measured with bench/gat_threshold.py and no crossover was
found -- edge-centric won at every average degree from 2 to 512 -- so it is +inf there
(`GPU_NODE_CENTRIC_MIN_AVG_DEGREE`); the CPU executor keeps 32, inside fuseGNN's bracket (4.5 ->
GAS, 492 -> GAR) near its log-midpoint, rounded to the warp width (the CPU sweep on the shared
2-core CI box was too noisy to move it). The skew guard keeps power-law graphs (a few huge rows,
most tiny) on the edge-centric path, which balances by edges. MGG_GAT_STRATEGY=node|edge forces a
strategy.
"""
from __future__ import annotations

import math
import os
import weakref
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..runtime.plan import AggregationPlan

__all__ = ["NODE_CENTRIC_MIN_AVG_DEGREE", "GPU_NODE_CENTRIC_MIN_AVG_DEGREE", "threshold_for", "MAX_DEGREE_SKEW",
           "global_degree_stats", "DegreeStats", "StrategyChoice",
           "degree_stats", "choose_strategy", "FusedAggregation", "fused_aggregation"]

NODE_CENTRIC_MIN_AVG_DEGREE = 32.0  # CPU executor: fuseGNN's bracket (GAS <= 4.5, GAR at 492)
MAX_DEGREE_SKEW = 64.0              # max/avg degree above which node-centric load balance suffers
#: GPU kernels, measured (bench/gat_threshold.py, H200, 4M edges, 8 heads x 8, fwd + bwd): the
#: edge-centric kernels beat the node-centric ones at every uniform average degree from 2 to 512
#: (edge/node time 0.77-0.82) and by 85x on a power-law graph -- no crossover in the measured
#: range, so the GPU runtime chooses edge-centric unless forced
GPU_NODE_CENTRIC_MIN_AVG_DEGREE = math.inf


def threshold_for(backend: str) -> float:
    """The average degree from which node-centric is chosen on `backend` ("gpu" | "cpu")."""
    return GPU_NODE_CENTRIC_MIN_AVG_DEGREE if backend == "gpu" else NODE_CENTRIC_MIN_AVG_DEGREE


@dataclass(frozen=True)
class DegreeStats:
    """Degrees of the rows a rank aggregates (local + remote CSR of its plan, no added self loops)."""

    n_local: int
    edges: int
    avg_degree: float
    max_degree: int
    remote_fraction: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StrategyChoice:
    strategy: str  # "node" | "edge"
    reason: str
    stats: DegreeStats

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "reason": self.reason, **self.stats.to_dict()}


def degree_stats(plan: AggregationPlan) -> DegreeStats:
    deg = np.diff(plan.local_indptr) + np.diff(plan.remote_indptr)
    n = int(plan.n_local)
    e = int(deg.sum())
    return DegreeStats(n_local=n, edges=e, avg_degree=(e / n) if n else 0.0,
                       max_degree=int(deg.max()) if n else 0,
                       remote_fraction=(plan.num_remote_edges / e) if e else 0.0)


def global_degree_stats(stats: DegreeStats, comm) -> DegreeStats:
    """The statistics of the whole graph from every rank's (collective with `comm`): the strategy
    must be the same on every rank, because the two executors run different collectives (the
    node-centric backward re-publishes the symmetric table; the edge-centric one does not)."""
    if comm is None or getattr(comm, "size", 1) <= 1:
        return stats
    n = int(comm.allreduce_scalar(float(stats.n_local)))
    e = int(comm.allreduce_scalar(float(stats.edges)))
    mx = int(comm.allreduce_scalar(float(stats.max_degree), "max"))
    remote = comm.allreduce_scalar(stats.remote_fraction * stats.edges)
    return DegreeStats(n_local=n, edges=e, avg_degree=(e / n) if n else 0.0, max_degree=mx,
                       remote_fraction=(remote / e) if e else 0.0)


def choose_strategy(stats: DegreeStats, threshold: float = NODE_CENTRIC_MIN_AVG_DEGREE,
                    max_skew: float = MAX_DEGREE_SKEW, force: str | None = None) -> StrategyChoice:
    """The rule of the module docstring; `force` (or MGG_GAT_STRATEGY) overrides it."""
    force = force or os.environ.get("MGG_GAT_STRATEGY") or None
    if force is not None:
        if force not in ("node", "edge"):
            raise ValueError(f"strategy must be 'node' or 'edge', got {force!r}")
        return StrategyChoice(force, "forced", stats)
    if stats.avg_degree < threshold:
        return StrategyChoice("edge", f"avg degree {stats.avg_degree:.1f} < {threshold:g}", stats)
    if stats.max_degree > max_skew * stats.avg_degree:
        return StrategyChoice("edge", f"max degree {stats.max_degree} > {max_skew:g} x avg "
                                      f"{stats.avg_degree:.1f}", stats)
    return StrategyChoice("node", f"avg degree {stats.avg_degree:.1f} >= {threshold:g}", stats)


class FusedAggregation:
    """A fused aggregation (mode additive / dot / mean) of one DistGraph, with its halo exchanges.

    `forward(feat [n, heads, C], src_score [n, heads] | None, dst, dropout, generator)` returns
    (out [n, heads, C], saved); `backward(grad_out, out, saved, feat, src_score, dst)` returns
    local gradients (feat, src_score, dst) with the remote rows' gradients already summed at
    their owners. Both collective. The executor comes from mgg.graph.factory.fused_executor:
    CPU: gather_halo + FusedCPUExecutor + scatter_halo_add; GPU: mgg.graph.gat_gpu
    (tests/nn/test_gat_gpu.py).
    """

    def __init__(self, dg, mode: str, add_self_loops: bool, negative_slope: float, strategy: str | None,
                 chunk_edges: int | None = None):
        from .halo import halo_plan
        from .factory import fused_executor

        self.dg, self.mode = dg, mode
        self.plan = halo_plan(dg)
        # one strategy for all ranks (collective): their executors' exchanges must match
        self.choice = choose_strategy(global_degree_stats(degree_stats(self.plan), dg.comm),
                                      threshold=threshold_for(dg.backend), force=strategy)
        self.strategy = self.choice.strategy
        self.impl = fused_executor(dg.backend, dg, self.plan, mode, add_self_loops, self.strategy,
                                   negative_slope, chunk_edges)

    def _table(self, feat, src_score):
        t = feat.reshape(feat.shape[0], feat.shape[1] * feat.shape[2])
        return t if src_score is None else torch.cat([t, src_score], dim=1)

    def forward(self, feat, src_score, dst, dropout=0.0, generator=None):
        if self.dg.backend == "gpu":
            return self.impl.forward(feat, src_score, dst, dropout, generator)
        from .halo import gather_halo

        n, heads, C = feat.shape
        halo = gather_halo(self.dg, self._table(feat, src_score))  # one exchange: [Wh, a_src.Wh]
        h_feat = halo[:, : heads * C].reshape(-1, heads, C)
        table_feat = torch.cat([feat, h_feat])
        table_src = None if src_score is None else torch.cat([src_score, halo[:, heads * C:]])
        out, m, den, keep = self.impl.forward(table_feat, table_src, dst, dropout, generator)
        return out, (m, den, keep, halo)

    def backward(self, grad_out, out, saved, feat, src_score, dst):
        if self.dg.backend == "gpu":
            return self.impl.backward(grad_out, out, saved, feat, src_score, dst)
        from .halo import scatter_halo_add

        m, den, keep, halo = saved
        n, heads, C = feat.shape
        table_feat = torch.cat([feat, halo[:, : heads * C].reshape(-1, heads, C)])
        table_src = None if src_score is None else torch.cat([src_score, halo[:, heads * C:]])
        gf, gs, gd = self.impl.backward(grad_out, out, m, den, keep, table_feat, table_src, dst)
        # remote rows' gradients go home in one exchange carrying [dWh, d(a_src.Wh)]
        back = scatter_halo_add(self.dg, self._table(gf[n:], None if gs is None else gs[n:]))
        grad_feat = gf[:n] + back[:, : heads * C].reshape(n, heads, C)
        grad_src = None if gs is None else gs[:n] + back[:, heads * C:]
        return grad_feat, grad_src, gd


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fused_aggregation(dg, mode: str, add_self_loops: bool = True, negative_slope: float = 0.2,
                      strategy: str | None = None) -> FusedAggregation:
    """The cached FusedAggregation of `dg` for these settings (strategy None: degree-adaptive)."""
    per_dg = _CACHE.setdefault(dg, {})
    key = (mode, bool(add_self_loops), float(negative_slope), strategy)
    fa = per_dg.get(key)
    if fa is None or fa.plan is not dg.plan("sum"):
        fa = per_dg[key] = FusedAggregation(dg, mode, add_self_loops, negative_slope, strategy)
    return fa
