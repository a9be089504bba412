"""Full-graph training (`--mode full`) on the shared epoch skeleton (loop.py).

Every rank builds its part of the `DistGraph`, holds a replica of the model and trains on its own
node range; gradients are summed over ranks after each backward and the loss is normalised by
the *global* number of training nodes, so P ranks follow the 1-rank run (dropout masks are drawn
for the whole graph from an identically seeded generator). Adds to the skeleton: resuming from a
checkpoint, checkpoints, the runtime tuner (`--tune`) and fault injection.
"""
from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import asdict, replace
from typing import Any

from .config import DEFAULT_TUNE_CACHE, TrainConfig, TrainResult, UserError, check_model_support, tune_variants
from .faults import fault_point, parse_fault
from .loop import (EpochHooks, LocalData, LoopState, distgraph_session, finish, local_data, progress_bar,
                   register_row_sets, run_epochs, untimed)
from .phases import PhaseClock
from .plan_summary import plan_summary

__all__ = ["train_full", "resume_state", "start_tuner"]


def resume_state(cfg: TrainConfig, comm, graph: Any):
    """(path, state) of the checkpoint `cfg.resume` names, None when there is none. Collective;
    an unusable checkpoint raises the same UserError on every rank."""
    from ..checkpoint import CheckpointError, graph_fingerprint, load_for_resume

    if not cfg.resume:
        return None
    try:
        found = load_for_resume(cfg.resume, cfg.checkpoint_dir, comm, fingerprint=graph_fingerprint(graph),
                                config=asdict(cfg))
    except CheckpointError as e:
        raise UserError(f"cannot resume: {e}") from e
    if found is not None and found[1]["epoch"] >= cfg.epochs:
        raise UserError(f"cannot resume: checkpoint {found[0]} is at epoch {found[1]['epoch']}; "
                        f"--epochs {cfg.epochs} leaves nothing to train")
    return found


def _search_space(cfg: TrainConfig, backend: str):
    """(SearchSpace, variants, cache key extra) of a --tune run: pinned knobs are not searched."""
    from ..tuning import SearchSpace

    variants = tune_variants(cfg, backend)
    pins = cfg.pinned()
    space = SearchSpace(**{f"{k}_values": (v,) for k, v in pins.items()}, variants=variants,
                        tune_ps_inter=False if cfg.ps_inter is not None else None)
    extra = ",".join(f"{k}={v}" for k, v in {**pins, "ps_inter": cfg.ps_inter}.items() if v is not None)
    return space, variants, extra


def start_tuner(cfg: TrainConfig, dg, comm, graph: Any, width: int, state: dict | None):
    """The runtime tuner of a --tune run and the timer of its aggregations (None, None without
    --tune). Collective. `state`: the tuner state of the checkpoint resumed from."""
    if not cfg.tune:
        return None, None
    from ..checkpoint import graph_fingerprint
    from ..nn.registry import model_entry
    from ..runtime import RankError
    from ..tuning import AggregationTimer, AggregationTuner

    space, variants, extra = _search_space(cfg, dg.backend)
    cache = os.path.expanduser(cfg.tune_cache or DEFAULT_TUNE_CACHE)
    tuner = err = None
    try:
        tuner = AggregationTuner.for_distgraph(
            dg, dim=width, kinds=(model_entry(cfg.model).aggregation,), fingerprint=graph_fingerprint(graph),
            cache_path=None if cfg.tune_cache in ("", "none") else cache, extra=extra, space=space,
            variants=variants, log_path=cfg.tune_log)
    except ValueError as e:  # no feasible configuration (e.g. pinned knobs that do not fit)
        err = e
    if tuner is not None and state and state.get("enabled"):
        try:
            tuner.load_state_dict(state)  # replays the checkpoint's trials
        except ValueError as e:
            err = ValueError(f"the checkpoint's tuner state belongs to another search (other "
                             f"--ps/--dist/--wpb/--variant/--ps-inter?): {e}")
    try:
        comm.check(err)
    except (ValueError, RankError) as e:
        raise UserError(f"--tune: {e}") from e
    return tuner, AggregationTimer(dg)


def check_cuda_graph(cfg: TrainConfig, device_type: str | None = None, world_size: int = 1) -> None:
    """UserError naming the flag when --cuda-graph cannot apply (before any GPU work): the tuner
    switches kernels between steps, --profile-steps times the parts on the host; a graph needs a
    GPU (`device_type`, once known). At P > 1 (`world_size`) the captured step holds the NVSHMEM
    barriers and sums of the aggregations and of batch norm (tests/kernels/test_dropout_project_gpu.py
    replays training at P = 2 against eager). Dropout takes its seeds from the GPU
    (mgg.nn.functional.DeviceSeeds), so each replay draws new masks."""
    if not cfg.cuda_graph:  # off, or None: decided by resolve_cuda_graph
        return
    for on, flag in ((cfg.tune, "--tune"), (cfg.profile_steps, "--profile-steps")):
        if on:
            raise UserError(f"--cuda-graph does not combine with {flag}")
    if device_type is not None and device_type != "cuda":
        raise UserError("--cuda-graph needs the GPU backend (--backend gpu on a machine with CUDA)")


def resolve_cuda_graph(cfg: TrainConfig, device_type: str, world_size: int = 1,
                       resumed: dict | None = None) -> TrainConfig:
    """`cfg` with `cuda_graph` a bool. Given (True or False): checked (check_cuda_graph) and kept.
    None (the default): on where a graph applies -- the GPU (`device_type` "cuda"), without
    --tune or --profile-steps -- unless the checkpoint resumed from (`resumed`, its saved config)
    was written with the other setting (its dropout seeds live on the GPU with a graph and in a
    host generator without). Measured to help on 4x H200 with default flags: 1.05-1.06x at
    P = 1, 1.05-1.31x at P = 2, 1.30-2.61x at P = 4 (docs/e2e.md)."""
    if cfg.cuda_graph is not None:
        check_cuda_graph(cfg, device_type, world_size)
        return cfg
    on = device_type == "cuda" and not cfg.tune and not cfg.profile_steps
    saved = (resumed or {}).get("cuda_graph")
    if on and isinstance(saved, bool):
        on = saved
    return replace(cfg, cuda_graph=on)


def _untimed(part: str):
    """The span of a step without --profile-steps: nothing."""
    return nullcontext()


class FullGraphHooks(EpochHooks):
    """One optimizer step over the whole graph per epoch, then the tuner's step and checkpoints."""

    def __init__(self, state: LoopState, model, opt, gen, fault):
        self.cfg, self.comm, self.dg, self.data, self.res = state.cfg, state.comm, state.dg, state.data, state.res
        self.model, self.opt, self.gen, self.fault = model, opt, gen, fault
        self.tuner = self.timer = self.ckpt = None
        self.fingerprint = ""
        self.profile = None  # a StepProfile with --profile-steps
        self.captured = None  # a CapturedStep with --cuda-graph
        self.train_index = self.train_target = None
        if self.data.train_rows is None:  # the loss over every training row of the full output: an
            import torch                  # index, so the step has no host sync (a bool mask has one)

            self.train_index = torch.nonzero(self.data.masks[0]).reshape(-1)
            self.train_target = self.data.y.index_select(0, self.train_index)

    def train_step(self, epoch: int):
        if self.captured is not None:  # --cuda-graph
            return self.captured(epoch)
        if self.profile is None:
            return self._step(epoch, _untimed)
        with self.profile.step():
            return self._step(epoch, self.profile.span)

    def _step(self, epoch: int, span):
        from ..nn import allreduce_gradients, cross_entropy_sum

        d = self.data
        self.opt.zero_grad(set_to_none=False)
        with span("forward"):
            if d.train_rows is not None:  # each layer on the rows the loss needs
                logits = self.model(d.x, self.dg, self.gen, rows=d.train_layers)
                target = d.y[d.train_rows.index]
            else:
                logits = self.model(d.x, self.dg, self.gen).index_select(0, self.train_index)
                target = self.train_target
            loss = cross_entropy_sum(logits, target) / d.n_train
        fault_point(self.fault, self.comm.rank, epoch)
        with span("backward"):
            loss.backward()
        with span("allreduce"):
            allreduce_gradients(self.model, self.comm, self.dg.store)
        with span("optimizer"):
            self.opt.step()
        return loss.detach()

    def after_step(self, epoch: int) -> None:
        if self.tuner is not None:  # this iteration's aggregation time; the next config applies
            self.tuner.step(self.timer.lap())  # collective (max over ranks) while searching
            self.res.tuner = self.tuner.state_dict()

    def eval_logits(self, data: LocalData):
        self.model.eval()
        with untimed(self.timer):
            return self.model(data.x, self.dg, None, rows=data.eval_layers)

    def end_epoch(self, epoch: int, state: LoopState) -> None:
        """A checkpoint when one is due, at the last epoch, or when the ranks stop on a signal."""
        from ..checkpoint import CheckpointError, capture_state

        res, ckpt = state.res, self.ckpt
        if ckpt is None or not (ckpt.due(epoch) or res.stopped or epoch == self.cfg.epochs):
            return
        why = res.stopped or ("end" if epoch == self.cfg.epochs else "periodic")
        try:
            res.checkpoint = ckpt.save(lambda: capture_state(
                epoch, self.model, self.opt, self.gen, history=res.epochs, last_eval=state.last, tuner=res.tuner,
                config=asdict(self.cfg), fingerprint=self.fingerprint, world_size=self.comm.size, reason=why))
        except CheckpointError as e:
            raise UserError(str(e)) from e


def _restore(resume, hooks: FullGraphHooks, state: LoopState) -> int:
    """Load the checkpoint `resume` = (path, state) into the model, optimizer, generator and the
    result; returns the epoch it was taken after (0 without one)."""
    from ..checkpoint import CheckpointError, restore_state

    if resume is None:
        return 0
    res = state.res
    res.resumed_from, saved = resume
    try:
        restore_state(saved, hooks.model, hooks.opt, hooks.gen, res.resumed_from)
    except CheckpointError as e:  # the same on every rank: all hold rank 0's state
        raise UserError(f"cannot resume: {e}") from e
    res.start_epoch = int(saved["epoch"])
    state.last, res.epochs, res.tuner = dict(saved["last_eval"]), list(saved["history"]), dict(saved["tuner"])
    return res.start_epoch


def _setup(cfg: TrainConfig, comm, dg, data: LocalData, fault) -> tuple[FullGraphHooks, LoopState]:
    """The model replica (same initial weights on every rank), optimizer, dropout generator and
    the loop state of a fresh run."""
    import torch

    from ..nn import broadcast_parameters, build_model
    from ..nn.optim import Adam

    model = build_model(cfg.model, data.x.shape[1], cfg.hidden, data.num_classes, cfg.layers,
                        cfg.dropout, norm=cfg.norm).to(dg.device)
    model.cache_input_aggregation = cfg.input_cache
    broadcast_parameters(model, comm)
    opt = Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, capturable=cfg.cuda_graph)
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # dropout masks, same on every rank
    if cfg.cuda_graph and cfg.dropout > 0:  # seeds a replayed graph can change: on the device
        from ..nn.functional import DeviceSeeds

        gen = DeviceSeeds(gen, dg.device)
    state = LoopState(cfg, comm, dg, data, TrainResult(model=model, world_size=comm.size, backend=dg.backend))
    return FullGraphHooks(state, model, opt, gen, fault), state


def _startup_phases(clock, dg, model: str, comm) -> None:
    """Build the model's forward and transposed plans and their executors now (the run's CUDA
    kernels built -- mgg.apps.kernel_prebuild -- or loaded from the cache, plans uploaded) as
    the `plan` and `build` phases, instead of inside the first epoch. Collective."""
    from ..nn.registry import model_entry
    from .kernel_prebuild import finish_kernel_prebuild

    kind = model_entry(model).aggregation
    if kind is not None:  # fused attention (GAT) builds its own structures in the first epoch
        with clock.phase("plan"):
            dg.plan(kind), dg.plan(kind, True)
    with clock.phase("build"):
        finish_kernel_prebuild(comm, dg.device)  # and the run's modules loaded onto its GPU
        if kind is not None:
            dg.prepare()


def train_full(cfg: TrainConfig, comm, graph: Any, prepared=None, verbose: bool = False,
               stop=None, clock=None) -> TrainResult:
    """Train `cfg.model` on `graph` over `comm`; collective, returns the same metrics on all ranks.

    With `cfg.resume` it continues from a checkpoint (the losses then match the uninterrupted
    run); with `cfg.checkpoint_dir` it writes checkpoints. `stop` (a StopSignal) ends the run
    at the end of the epoch in which any rank got the signal, after a checkpoint.
    """
    from ..checkpoint import Checkpointer, graph_fingerprint
    from ..data.prepare import prepare_graph

    check_model_support(cfg.model, cfg.mode, cfg.tune)
    cfg = cfg.resolved()
    check_cuda_graph(cfg)
    fault = parse_fault(os.environ.get("MGG_FAULT_INJECT"))
    resume = resume_state(cfg, comm, graph)
    if prepared is None:  # not through `load`: the labels are range-checked here
        from .classes import resolve_num_classes, with_num_classes

        prepared = with_num_classes(prepare_graph(graph, cfg.seed, deferred=True), resolve_num_classes(cfg, comm, graph))
    prep = prepared
    clock = clock or PhaseClock(comm, show=False)
    with distgraph_session(cfg, comm, graph) as (dg, teardown):
        cfg = resolve_cuda_graph(cfg, dg.device.type, comm.size, resume[1]["config"] if resume else None)
        for name in ("partition", "store"):  # DistGraph's construction
            clock.add(name, dg.build_seconds[name])
        with clock.phase("data"):  # this rank's features, labels and masks on its device
            data = local_data(dg, prep)
            if cfg.row_sets:  # before the plans: theirs are built with them
                register_row_sets(dg, data, cfg.layers)  # cfg is resolved: layers is set
        _startup_phases(clock, dg, cfg.model, comm)
        with clock.phase("model"):
            hooks, state = _setup(cfg, comm, dg, data, fault)
        state.res.row_sets = {r.name: r.num_global for sets in (data.train_layers, data.eval_layers)
                              for r in (sets or ()) if r is not None}
        from ..nn.registry import model_entry

        state.res.plans = plan_summary(dg, model_entry(cfg.model).aggregation)
        state.stop, state.clock = stop, clock
        start = _restore(resume, hooks, state)
        if verbose and comm.rank == 0 and cfg.resume:  # before the epochs it explains
            print(f"resumed from {resume[0]} after epoch {start}" if resume else
                  f"--resume {cfg.resume}: no checkpoint in {cfg.checkpoint_dir or cfg.resume}; training starts at "
                  f"epoch 1", flush=True)
        hooks.tuner, hooks.timer = start_tuner(cfg, dg, comm, graph, max(state.data.x.shape[1], cfg.hidden),
                                               state.res.tuner)
        if hooks.timer is not None:
            teardown.always.append(hooks.timer.close)
        if cfg.checkpoint_dir:
            hooks.ckpt = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, comm)
            hooks.fingerprint = graph_fingerprint(graph)
        if cfg.profile_steps:
            from .step_profile import StepProfile

            hooks.profile = StepProfile(dg.device.type == "cuda")
            hooks.profile.attach(dg)  # after the tuner's timer: unwrapped first, below
        if cfg.cuda_graph:
            from .graphed import CapturedStep

            hooks.captured = CapturedStep(lambda e: hooks._step(e, _untimed), comm)
            teardown.always.append(hooks.captured.close)  # also when training fails
        state.bar = progress_bar(cfg, comm, start) if verbose else None
        run_epochs(state, hooks, start)
        if hooks.captured is not None:
            c = hooks.captured
            state.res.cuda_graph = "replayed" if c.captured else f"eager: {c.why_eager or 'too few epochs'}"
            c.close()  # before evaluation and exit: no captured NVSHMEM work outlives the loop
        if hooks.profile is not None:
            hooks.profile.detach()
            state.res.step_profile = hooks.profile.summary(comm)
        finish(state, hooks.tuner)
        if hooks.tuner is not None and cfg.tune_log and comm.rank == 0:
            hooks.tuner.write_log(cfg.tune_log)  # also when the search did not finish, or was cached
        return state.res
