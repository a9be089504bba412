"""`--mode sampled`: neighbor-sampled mini-batch training (docs/sampling.md) on the shared epoch
skeleton (loop.py).

Data-parallel: every step has a global batch of P x --batch-size training nodes, and every rank
trains on its share of it (mgg.sample.batching), sampled from the global CSR it holds, with input
features from the symmetric store (one-sided gets) or the host tier. The loss of a step is the
mean cross entropy over its global batch (PyG's and DGL's convention): each rank backpropagates
its summed cross entropy, and `allreduce_mean_gradients` sums the gradients and the seed counts
over the ranks and divides, so the replicas stay identical and the step means the same at every
P and batch size. The epoch's loss is the mean of its steps' losses.

Evaluation is full-neighborhood inference: the sampled model's weights are copied into its
full-graph twin (`to_full_graph()`, same parameters) and run through the distributed aggregation
of the DistGraph, so test accuracy is comparable with --mode full.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from .config import DEFAULT_BATCH_SIZE, TrainConfig, TrainResult, UserError, check_model_support
from .loop import EpochHooks, LocalData, LoopState, distgraph_session, finish, local_data, progress_bar, run_epochs

__all__ = ["train_sampled", "check_sampled_config", "sampled_batch_size", "check_feature_budget", "SUMMED",
           "sampled_edges_per_s"]

#: per-epoch loader counters summed over the ranks (EpochStats fields)
SUMMED = ("steps", "seeds", "nodes", "edges", "rows_fetched", "rows_reused", "bytes_fetched", "bytes_remote",
          "bytes_no_reuse")


def check_sampled_config(cfg: TrainConfig) -> TrainConfig:
    """The resolved config of a sampled run; UserError on what --mode sampled cannot do (the CLI
    refuses these while parsing; this covers TrainConfig built in code)."""
    check_model_support(cfg.model, "sampled", False)
    if cfg.fanout is not None and cfg.layers is not None and cfg.layers != len(cfg.fanout):
        raise UserError(f"--layers {cfg.layers} conflicts with --fanout {','.join(map(str, cfg.fanout))}: the "
                        f"number of layers is the number of fanouts")
    for key, flag in (("tune", "--tune"), ("checkpoint_dir", "--checkpoint-dir"), ("resume", "--resume")):
        if getattr(cfg, key):
            raise UserError(f"{flag} is not supported with --mode sampled yet")
    r = cfg.resolved()
    try:
        from ..sample import check_fanouts

        check_fanouts(r.fanout, "--fanout")
    except ValueError as e:
        raise UserError(str(e)) from e
    if r.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {r.batch_size}")
    if r.feature_memory_budget < 0:
        raise UserError(f"--feature-memory-budget must be >= 0, got {r.feature_memory_budget}")
    return r


def sampled_batch_size(requested: int | None, n_train: int, world_size: int) -> int:
    """The per-rank batch size of a run over `n_train` training nodes on `world_size` ranks:
    `requested` (--batch-size), or, when None, DEFAULT_BATCH_SIZE capped at each rank's share of
    the training set, ceil(n_train / P) (one step per epoch then holds the whole training set).
    UserError (the same on every rank: its inputs are) when there is no training node, or when
    `requested` exceeds that share, which no step could fill."""
    if n_train < 1:
        raise UserError("the dataset has no training nodes (its train mask is empty): --mode sampled has "
                        "nothing to draw mini-batches from")
    share = -(-n_train // world_size)
    if requested is None:
        return min(DEFAULT_BATCH_SIZE, share)
    if requested > share:
        ranks = f"over {world_size} ranks, " if world_size > 1 else ""
        raise UserError(f"--batch-size {requested} is larger than the training set allows: {n_train} training "
                        f"nodes, {ranks}at most {share} per rank and step; use --batch-size {share} or less "
                        f"({share}: one step per epoch holds every training node)")
    return requested


def check_feature_budget(budget: int, max_share: int, feat_dim: int) -> None:
    """UserError when a nonzero --feature-memory-budget cannot hold one mini-batch: every batch
    gathers at least the input rows of its own seeds (max_share rows of feat_dim float32), and
    more with their sampled neighbors."""
    need = max_share * feat_dim * 4
    if budget and budget < need:
        raise UserError(f"--feature-memory-budget {budget} bytes cannot hold one mini-batch: a batch gathers the "
                        f"input features of at least its {max_share} seeds ({max_share} x {feat_dim} x 4 = {need} "
                        f"bytes), more with their sampled neighbors; give at least {need} bytes, or 0 for no limit")


class SampledHooks(EpochHooks):
    """One pass over the loader's mini-batches per epoch; sums the loader's counters."""

    def __init__(self, state: LoopState, model, opt, drop_gen, loader, graphed: bool = False):
        """graphed: replay the step from a CUDA graph over padded batches (mgg.apps.sampled_graphed)."""
        from functools import partial

        from .sampled_graphed import PaddedStep, eager_step, padded_step

        self.cfg, self.comm, self.dg, self.res = state.cfg, state.comm, state.dg, state.res
        self.model, self.opt, self.drop_gen, self.loader = model, opt, drop_gen, loader
        self.totals = dict.fromkeys(SUMMED + ("bytes_identity_order",), 0)
        self.sample_ms_ranks = 0.0   # sampling milliseconds of the run, summed over the ranks
        args = (model, opt, self.comm, self.dg.store, drop_gen)
        self.step = partial(eager_step, *args)
        if graphed:
            self.step = PaddedStep(model, self.step, partial(padded_step, *args), self.comm)

    def train_step(self, epoch: int):
        import torch

        loss_sum = torch.zeros((), dtype=torch.float64, device=self.dg.device)  # on the device: no sync per step
        steps = 0
        for batch in self.loader:
            loss_sum += self.step(batch)
            steps += 1
        return loss_sum / max(steps, 1)

    def epoch_values(self) -> dict[str, float]:
        """The loader's counters (summed), bytes in identity order, sample/gather ms (averaged later)."""
        st = self.loader.stats
        ident = st.bytes_identity_order if st.bytes_identity_order is not None else st.bytes_fetched
        return {**{k: float(getattr(st, k)) for k in SUMMED}, "bytes_identity_order": float(ident),
                "sample_ms": st.sample_ms, "gather_ms": st.gather_ms}

    def eval_logits(self, data: LocalData):
        full = self.model.to_full_graph()
        return full(data.x, self.dg, None)

    def record(self, rec: dict, values: dict[str, float]) -> None:
        counters = {name: int(values[name]) for name in SUMMED}
        rec.update(counters)
        if self.cfg.reorder:
            rec["bytes_identity_order"] = int(values["bytes_identity_order"])
        rec["sample_ms"] = values["sample_ms"] / self.comm.size
        rec["gather_ms"] = values["gather_ms"] / self.comm.size
        for name in SUMMED:
            self.totals[name] += counters[name]
        self.totals["bytes_identity_order"] += int(values["bytes_identity_order"])
        self.sample_ms_ranks += values["sample_ms"]


def _loader(cfg: TrainConfig, comm, graph: Any, dg, prep, seeds: np.ndarray, teardown):
    """(NeighborLoader over this rank's shares of the global batches of `seeds`, its feature source)."""
    from ..sample import NeighborLoader, make_feature_source

    feats = make_feature_source(prep.x, dg.store, dg.bounds, comm, cfg.feature_memory_budget, device=dg.device)
    teardown.together.append(feats.close)  # collective: only when every rank gets there
    loader = NeighborLoader((graph.indptr, graph.indices), feats, prep.y, seeds, list(cfg.fanout),
                            cfg.batch_size, shuffle=True, reorder=cfg.reorder, reuse=reuse_pays(cfg, comm, feats),
                            seed=cfg.sample_seed, device=dg.device, comm=comm,
                            adjacency_budget=cfg.feature_memory_budget, prefetch=cfg.prefetch,
                            index_features=True)
    return loader, feats


def sampled_cuda_graph(cfg: TrainConfig, device_type: str, model) -> bool:
    """Whether the sampled step is replayed from a CUDA graph over padded batches
    (mgg.apps.sampled_graphed): on the GPU unless --no-cuda-graph, for models whose block
    convolutions aggregate with block_sum (SAGE, GCN); --cuda-graph on the CPU or with another
    model is a UserError."""
    from .sampled_graphed import can_pad

    if cfg.cuda_graph is False:
        return False
    if cfg.cuda_graph and device_type != "cuda":
        raise UserError("--cuda-graph needs the GPU backend (--backend gpu on a machine with CUDA)")
    if cfg.cuda_graph and not can_pad(model):
        raise UserError(f"--cuda-graph with --mode sampled supports models whose block convolutions use "
                        f"block_sum (sage, gcn), not --model {cfg.model}")
    return device_type == "cuda" and can_pad(model)


def reuse_pays(cfg: TrainConfig, comm, feats) -> bool:
    """Whether batches reuse the previous batch's rows (mgg.sample.ResidentCache): yes where a row
    is read over PCIe, from the host or through MPI (the host tier, the CPU) or Match-Reorder
    orders the batches for it; no from the GPUs' symmetric store, at any P: the lookup, the sort
    and the two scatters of the reuse cost more GPU time than gathering every row again, over
    NVLink too (products-like at P = 2, docs/sampling.md)."""
    gpu_store = feats.tier == "store" and feats.device.type == "cuda"
    return bool(cfg.reorder) or not gpu_store


def _sampling_summary(cfg: TrainConfig, comm, hooks: SampledHooks, feats, res: TrainResult) -> dict:
    """res.sampling: the loader's settings and the byte totals of the run."""
    loader = hooks.loader
    plan = loader.plan
    doc = {
        "fanout": list(cfg.fanout), "batch_size": cfg.batch_size, "global_batch_size": plan.global_batch_size,
        "steps_per_epoch": len(loader), "training_nodes": plan.num_seeds, "feature_tier": feats.tier,
        "adjacency": loader.adjacency_tier, "reorder": cfg.reorder, "reuse": loader.reuse, "prefetch": loader.prefetch,
        "id_map": loader.id_map, "feature_memory_budget": cfg.feature_memory_budget,
        "sample_seed": cfg.sample_seed, "epochs": len(res.epochs),
        **{f"{k}_total": v for k, v in hooks.totals.items()},
    }
    if not cfg.reorder:
        doc.pop("bytes_identity_order_total")
    doc["sample_ms_total"] = hooks.sample_ms_ranks / comm.size
    doc["sampled_edges_per_s"] = sampled_edges_per_s(hooks.totals["edges"], hooks.sample_ms_ranks)
    return doc


def sampled_edges_per_s(edges: int, sample_ms: float) -> float | None:
    """The sampler's speed on one rank: sampled edges (every block's edges of every batch) per
    second of the loader's sampling time (host time from a batch's seeds to its blocks, which
    ends with the last hop's size read, so it covers the sampling kernels), over all ranks'
    edges and all ranks' sampling time; None when nothing was timed."""
    return edges / (sample_ms / 1e3) if sample_ms > 0 else None


def train_sampled(cfg: TrainConfig, comm, graph: Any, prepared=None, verbose: bool = False,
                  stop=None, clock=None) -> TrainResult:
    """Sampled mini-batch training of the model's sampled twin (mgg.nn.registry); collective,
    returns the same metrics on every rank."""
    import torch

    from ..data.prepare import prepare_graph
    from ..nn import broadcast_parameters
    from ..nn.optim import Adam
    from ..nn.registry import model_entry
    from ..sample import BatchPlan
    from .kernel_prebuild import finish_kernel_prebuild

    requested = cfg.batch_size
    cfg = check_sampled_config(cfg)
    if prepared is None:  # not through `load`: the labels are range-checked here
        from .classes import resolve_num_classes, with_num_classes

        prepared = with_num_classes(prepare_graph(graph, cfg.seed), resolve_num_classes(cfg, comm, graph))
    prep = prepared
    seeds = np.flatnonzero(prep.train)  # every rank's training nodes: each takes its share of every batch
    cfg = replace(cfg, batch_size=sampled_batch_size(requested, len(seeds), comm.size))
    check_feature_budget(cfg.feature_memory_budget, BatchPlan(len(seeds), cfg.batch_size, comm.size).max_share,
                         int(prep.x.shape[1]))
    with distgraph_session(cfg, comm, graph) as (dg, teardown):
        with clock.phase("build") if clock is not None else nullcontext():
            finish_kernel_prebuild(comm, dg.device)  # the run's kernels, built while the graph loaded, loaded
        loader, feats = _loader(cfg, comm, graph, dg, prep, seeds, teardown)
        data = local_data(dg, prep)
        model = model_entry(cfg.model).sampled_model(prep.x.shape[1], cfg.hidden, prep.num_classes, cfg.layers,
                                                     cfg.dropout).to(dg.device)
        broadcast_parameters(model, comm)
        graphed = sampled_cuda_graph(cfg, dg.device.type, model)
        drop_gen = torch.Generator().manual_seed(cfg.seed + 1 + comm.rank)  # dropout: per rank
        if dg.device.type == "cuda":  # seeds drawn on the GPU: no host synchronisation, and replayable
            from ..nn.functional import DeviceSeeds

            drop_gen = DeviceSeeds(drop_gen, dg.device)
        opt = Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, capturable=graphed)
        res = TrainResult(model=model, world_size=comm.size, backend=dg.backend, mode="sampled")
        state = LoopState(cfg, comm, dg, data, res, stop=stop, clock=clock)
        hooks = SampledHooks(state, model, opt, drop_gen, loader, graphed)
        state.bar = progress_bar(cfg, comm, 0) if verbose else None
        run_epochs(state, hooks)
        finish(state, None)
        if graphed:
            st = hooks.step
            res.cuda_graph = (f"replayed ({st.replays} steps, {st.eager_steps} eager)" if st.captured
                              else f"eager: {st.why_eager or 'not captured'}")
        res.sampling = _sampling_summary(cfg, comm, hooks, feats, res)
        return res
