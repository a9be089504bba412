"""`python -m mgg.train --mode sampled`: neighbor-sampled mini-batch training (docs/sampling.md).

Data-parallel: every rank trains on its own seeds (the training nodes it owns), sampled from the
global CSR it holds, with input features from the symmetric store (one-sided gets) or the host
tier; after every step the gradients are summed over the ranks (`allreduce_gradients`), so the
replicas stay identical. The loss of a step is the summed cross entropy of its seeds divided by
the *global* number of training nodes: an epoch's summed loss is the mean training loss.

Evaluation is full-neighborhood inference: the SampledSAGE weights are copied into the full-graph
SAGE (same parameters) and run through the distributed aggregation of the DistGraph, so test
accuracy is comparable with --mode full.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .train import (SAMPLED_MODELS, TrainConfig, TrainResult, UserError, _accuracies, _build_distgraph,
                    _close_epoch, _counts, _finish, _local_data, _progress, prepare_graph)

__all__ = ["train_sampled", "sampling_line", "check_sampled_config"]

#: per-epoch counters summed over the ranks (EpochStats fields)
_SUMMED = ("steps", "seeds", "nodes", "edges", "rows_fetched", "rows_reused", "bytes_fetched", "bytes_remote",
           "bytes_no_reuse")


def check_sampled_config(cfg: TrainConfig) -> TrainConfig:
    """The resolved config of a sampled run; UserError on what --mode sampled cannot do (the CLI
    refuses these while parsing; this covers TrainConfig built in code)."""
    if cfg.model not in SAMPLED_MODELS:
        raise UserError(f"--mode sampled supports --model {', '.join(SAMPLED_MODELS)} only, got {cfg.model!r}")
    if cfg.fanout is not None and cfg.layers is not None and cfg.layers != len(cfg.fanout):
        raise UserError(f"--layers {cfg.layers} conflicts with --fanout {','.join(map(str, cfg.fanout))}: the "
                        f"number of layers is the number of fanouts")
    for key, flag in (("tune", "--tune"), ("checkpoint_dir", "--checkpoint-dir"), ("resume", "--resume")):
        if getattr(cfg, key):
            raise UserError(f"{flag} is not supported with --mode sampled yet")
    r = cfg.resolved()
    try:
        from .sample import check_fanouts

        check_fanouts(r.fanout, "--fanout")
    except ValueError as e:
        raise UserError(str(e)) from e
    if r.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {r.batch_size}")
    if r.feature_memory_budget < 0:
        raise UserError(f"--feature-memory-budget must be >= 0, got {r.feature_memory_budget}")
    return r


def train_sampled(cfg: TrainConfig, comm, graph: Any, prepared=None, verbose: bool = False,
                  stop=None) -> TrainResult:
    """Sampled mini-batch training of SampledSAGE; collective, same metrics on every rank."""
    import torch
    import torch.nn.functional as F

    from .nn import SampledSAGE, allreduce_gradients, broadcast_parameters
    from .sample import NeighborLoader, make_feature_source, split_seeds

    cfg = check_sampled_config(cfg)
    prep = prepared if prepared is not None else prepare_graph(graph, cfg.seed)
    dg = _build_distgraph(cfg, comm, graph)
    closing = False
    feats = None
    try:
        dev = dg.device
        feats = make_feature_source(prep.x, dg.store, dg.bounds, comm, cfg.feature_memory_budget, device=dev)
        seeds = split_seeds(np.flatnonzero(prep.train), comm, dg.bounds)
        loader = NeighborLoader((graph.indptr, graph.indices), feats, prep.y, seeds, list(cfg.fanout),
                                cfg.batch_size, shuffle=True, reorder=cfg.reorder, reuse=True,
                                seed=cfg.sample_seed, device=dev, comm=comm,
                                adjacency_budget=cfg.feature_memory_budget, prefetch=cfg.prefetch)
        x, y, masks, n_train = _local_data(dg, prep)
        model = SampledSAGE(prep.x.shape[1], cfg.hidden, prep.num_classes, cfg.layers, cfg.dropout).to(dev)
        broadcast_parameters(model, comm)
        drop_gen = torch.Generator(device=dev).manual_seed(cfg.seed + 1 + comm.rank)  # dropout: per rank
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        res = TrainResult(model=model, world_size=comm.size, backend=dg.backend, mode="sampled")
        last = {"train_acc": None, "val_acc": None, "test_acc": None}
        times: list[float] = []
        totals = dict.fromkeys(_SUMMED + ("bytes_identity_order",), 0)
        bar = _progress(cfg, comm, 0) if verbose else None
        for epoch in range(1, cfg.epochs + 1):
            model.train()
            comm.barrier()
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), dtype=torch.float64, device=dev)  # on the device: no sync per step
            for batch in loader:
                opt.zero_grad(set_to_none=False)
                logits = model(batch.x, batch.blocks, drop_gen)
                loss = F.cross_entropy(logits, batch.y, reduction="sum") / n_train
                loss.backward()
                allreduce_gradients(model, comm)
                opt.step()
                loss_sum += loss.detach()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            comm.barrier()
            ms = (time.perf_counter() - t0) * 1e3
            times.append(ms)
            st = loader.stats
            ident = st.bytes_identity_order if st.bytes_identity_order is not None else st.bytes_fetched
            # [loss, stop, per-epoch counters (summed), sample/gather ms (averaged), correct/total per mask]
            stats = [float(loss_sum), float(bool(stop is not None and stop.requested))]
            stats += [float(getattr(st, k)) for k in _SUMMED] + [float(ident), st.sample_ms, st.gather_ms]
            do_eval = epoch % cfg.eval_every == 0 or epoch == cfg.epochs
            if do_eval:
                full = model.to_full_graph()
                with torch.no_grad():
                    stats += _counts(full(x, dg, None), y, masks)
            buf = comm.allreduce_(np.asarray(stats, dtype=np.float64))
            k = 2 + len(_SUMMED)
            counters = {name: int(v) for name, v in zip(_SUMMED, buf[2:k])}
            rec = {"epoch": epoch, "loss": float(buf[0]), "train_acc": last["train_acc"],
                   "val_acc": last["val_acc"], "epoch_ms": ms, **counters}
            if cfg.reorder:
                rec["bytes_identity_order"] = int(buf[k])
            rec["sample_ms"], rec["gather_ms"] = float(buf[k + 1]) / comm.size, float(buf[k + 2]) / comm.size
            for name in _SUMMED:
                totals[name] += counters[name]
            totals["bytes_identity_order"] += int(buf[k])
            if do_eval:
                last = _accuracies(buf, k + 3)
                rec.update(train_acc=last["train_acc"], val_acc=last["val_acc"])
            _close_epoch(res, rec, last, bar, buf[1], epoch, cfg, stop)
            if res.stopped:
                break
        _finish(res, bar, last, times, dg, None)
        seeds_per_rank = [int(v) for v in comm.allgather(len(seeds))]
        res.sampling = {
            "fanout": list(cfg.fanout), "batch_size": cfg.batch_size, "steps_per_epoch": len(loader),
            "seeds_per_rank": seeds_per_rank, "feature_tier": feats.tier, "adjacency": loader.adjacency_tier,
            "reorder": cfg.reorder, "reuse": True, "prefetch": loader.prefetch, "id_map": loader.id_map,
            "feature_memory_budget": cfg.feature_memory_budget, "sample_seed": cfg.sample_seed,
            "epochs": len(res.epochs), **{f"{k}_total": v for k, v in totals.items()},
        }
        if not cfg.reorder:
            res.sampling.pop("bytes_identity_order_total")
        closing = True
        return res
    except UserError:
        closing = True
        raise
    finally:
        if closing:  # collective: only when every rank gets here
            if feats is not None:
                feats.close()
            dg.close()


def _mb(b: float) -> str:
    return f"{b / 2**20:.2f}MiB"


def sampling_line(s: dict) -> str:
    """One summary line of a sampled run (printed by rank 0)."""
    line = (f"sampling: fanout={','.join(map(str, s['fanout']))} batch_size={s['batch_size']} "
            f"steps_per_epoch={s['steps_per_epoch']} features={s['feature_tier']} reorder={s['reorder']} "
            f"fetched={_mb(s['bytes_fetched_total'])} (remote {_mb(s['bytes_remote_total'])}; "
            f"without reuse {_mb(s['bytes_no_reuse_total'])}")
    if "bytes_identity_order_total" in s:
        line += f"; reuse without reorder {_mb(s['bytes_identity_order_total'])}"
    return line + f") rows_reused={s['rows_reused_total']}"

