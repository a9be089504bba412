"""`--mode sampled`: neighbor-sampled mini-batch training (docs/sampling.md) on the shared epoch
skeleton (loop.py).

Data-parallel: every rank trains on its own seeds (the training nodes it owns), sampled from the
global CSR it holds, with input features from the symmetric store (one-sided gets) or the host
tier; after every step the gradients are summed over the ranks (`allreduce_gradients`), so the
replicas stay identical. The loss of a step is the summed cross entropy of its seeds divided by
the *global* number of training nodes: an epoch's summed loss is the mean training loss.

Evaluation is full-neighborhood inference: the sampled model's weights are copied into its
full-graph twin (`to_full_graph()`, same parameters) and run through the distributed aggregation
of the DistGraph, so test accuracy is comparable with --mode full.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np

from .config import TrainConfig, TrainResult, UserError, check_model_support
from .loop import EpochHooks, LocalData, LoopState, distgraph_session, finish, local_data, progress_bar, run_epochs

__all__ = ["train_sampled", "check_sampled_config", "SUMMED"]

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


class SampledHooks(EpochHooks):
    """One pass over the loader's mini-batches per epoch; sums the loader's counters."""

    def __init__(self, state: LoopState, model, opt, drop_gen, loader):
        self.cfg, self.comm, self.dg, self.res = state.cfg, state.comm, state.dg, state.res
        self.model, self.opt, self.drop_gen, self.loader = model, opt, drop_gen, loader
        self.n_train = state.data.n_train
        self.totals = dict.fromkeys(SUMMED + ("bytes_identity_order",), 0)

    def train_step(self, epoch: int):
        import torch

        from ..nn import allreduce_gradients, cross_entropy_sum

        loss_sum = torch.zeros((), dtype=torch.float64, device=self.dg.device)  # on the device: no sync per step
        for batch in self.loader:
            self.opt.zero_grad(set_to_none=False)
            logits = self.model(batch.x, batch.blocks, self.drop_gen)
            loss = cross_entropy_sum(logits, batch.y) / self.n_train
            loss.backward()
            allreduce_gradients(self.model, self.comm)
            self.opt.step()
            loss_sum += loss.detach()
        return loss_sum

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


def _loader(cfg: TrainConfig, comm, graph: Any, dg, prep, teardown):
    """(NeighborLoader over this rank's training seeds, its feature source, the seeds)."""
    from ..sample import NeighborLoader, make_feature_source, split_seeds

    feats = make_feature_source(prep.x, dg.store, dg.bounds, comm, cfg.feature_memory_budget, device=dg.device)
    teardown.together.append(feats.close)  # collective: only when every rank gets there
    seeds = split_seeds(np.flatnonzero(prep.train), comm, dg.bounds)
    loader = NeighborLoader((graph.indptr, graph.indices), feats, prep.y, seeds, list(cfg.fanout),
                            cfg.batch_size, shuffle=True, reorder=cfg.reorder, reuse=True,
                            seed=cfg.sample_seed, device=dg.device, comm=comm,
                            adjacency_budget=cfg.feature_memory_budget, prefetch=cfg.prefetch)
    return loader, feats, seeds


def _sampling_summary(cfg: TrainConfig, comm, hooks: SampledHooks, feats, seeds, res: TrainResult) -> dict:
    """res.sampling: the loader's settings and the byte totals of the run."""
    loader = hooks.loader
    doc = {
        "fanout": list(cfg.fanout), "batch_size": cfg.batch_size, "steps_per_epoch": len(loader),
        "seeds_per_rank": [int(v) for v in comm.allgather(len(seeds))], "feature_tier": feats.tier,
        "adjacency": loader.adjacency_tier, "reorder": cfg.reorder, "reuse": True, "prefetch": loader.prefetch,
        "id_map": loader.id_map, "feature_memory_budget": cfg.feature_memory_budget,
        "sample_seed": cfg.sample_seed, "epochs": len(res.epochs),
        **{f"{k}_total": v for k, v in hooks.totals.items()},
    }
    if not cfg.reorder:
        doc.pop("bytes_identity_order_total")
    return doc


def train_sampled(cfg: TrainConfig, comm, graph: Any, prepared=None, verbose: bool = False,
                  stop=None, clock=None) -> TrainResult:
    """Sampled mini-batch training of the model's sampled twin (mgg.nn.registry); collective,
    returns the same metrics on every rank."""
    import torch

    from ..data.prepare import prepare_graph
    from ..nn import broadcast_parameters
    from ..nn.optim import Adam
    from ..nn.registry import model_entry

    from .kernel_prebuild import finish_kernel_prebuild

    cfg = check_sampled_config(cfg)
    if prepared is None:  # not through `load`: the labels are range-checked here
        from .classes import resolve_num_classes, with_num_classes

        prepared = with_num_classes(prepare_graph(graph, cfg.seed), resolve_num_classes(cfg, comm, graph))
    prep = prepared
    with distgraph_session(cfg, comm, graph) as (dg, teardown):
        with clock.phase("build") if clock is not None else nullcontext():
            finish_kernel_prebuild(comm, dg.device)  # the run's kernels, built while the graph loaded, loaded
        loader, feats, seeds = _loader(cfg, comm, graph, dg, prep, teardown)
        data = local_data(dg, prep)
        model = model_entry(cfg.model).sampled_model(prep.x.shape[1], cfg.hidden, prep.num_classes, cfg.layers,
                                                     cfg.dropout).to(dg.device)
        broadcast_parameters(model, comm)
        drop_gen = torch.Generator(device=dg.device).manual_seed(cfg.seed + 1 + comm.rank)  # dropout: per rank
        opt = Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        res = TrainResult(model=model, world_size=comm.size, backend=dg.backend, mode="sampled")
        state = LoopState(cfg, comm, dg, data, res, stop=stop)
        hooks = SampledHooks(state, model, opt, drop_gen, loader)
        state.bar = progress_bar(cfg, comm, 0) if verbose else None
        run_epochs(state, hooks)
        finish(state, None)
        res.sampling = _sampling_summary(cfg, comm, hooks, feats, seeds, res)
        return res
