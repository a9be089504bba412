"""The training command line: `mpirun -np P python -m mgg.train [flags]` (console script `mgg-train`).

Flags -> TrainConfig (`parse_args`, mgg.apps.args), load the dataset on every rank agreeing on
errors (`load`), train in the mode asked for (`train`: full.py or sampled.py), report on rank 0
(`run`), and exit with one status on every rank (`main`: 2 on user errors, 128 + signal after a
signal stop).
"""
from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any, Sequence

from .args import build_parser, parse_args
from .config import MODES, TrainConfig, TrainResult, UserError
from .memory_check import ASSUMED_CLASSES

__all__ = ["build_parser", "parse_args", "load", "train", "run", "main", "save_weights"]


# -- running --------------------------------------------------------------------------------------
def load(cfg: TrainConfig, comm, clock=None) -> tuple[Any, Any]:
    """(graph, PreparedGraph): load and prepare the dataset on every rank; a user error on any
    rank -> UserError on all. `clock` (a PhaseClock) times the `load` and `prepare` phases.
    Generated presets are drawn on the GPU when the run uses one (the same graph as on the CPU).
    The labels are range-checked as loaded (rows named as in the file; mgg.apps.classes) and the
    prepared graph trains the number of classes decided there."""
    from ..runtime import RankError
    from .classes import agree_num_classes, label_share, with_num_classes

    graph = prep = share = None
    err: BaseException | None = None
    stage = "load"
    nodes = comm.node_of_ranks()  # collective: before anything that can fail on one rank
    host_ranks = int((nodes == nodes[comm.rank]).sum())
    try:
        from ..data import load_dataset
        from ..data.prepare import prepare_graph

        from ..graph.backends import resolve_backend
        from .node_order import AUTO_MIN_NODES
        from .phases import PhaseClock

        clock = clock or PhaseClock(comm, show=False)
        device = None
        if resolve_backend(cfg.backend) == "gpu":  # this rank's GPU, not every rank's GPU 0
            import torch

            from ..runtime.gpu_assignment import device_index

            device = f"cuda:{device_index(comm.local_rank, torch.cuda.device_count())}"
        explicit = cfg.reorder_nodes not in ("auto", "none")
        with clock.phase("load"):  # a graph relabelled on request is built whole, so it is not mapped
            graph = load_dataset(cfg.dataset, scale=cfg.scale, seed=cfg.seed, device=device, mmap=not explicit,
                                 to_undirected=cfg.undirected)
            share = label_share(graph, comm.rank, comm.size, cfg.num_classes)  # before any relabelling
            if getattr(graph, "mapped", False):  # each rank checks its share here: a file error
                graph, prep = _prepare_mapped(cfg, comm, graph)
        choice = None
        if cfg.reorder_nodes != "none" and (explicit or graph.num_nodes >= AUTO_MIN_NODES):
            with clock.phase("reorder"):
                before = graph
                graph, choice = _node_order(cfg, graph, device or "cpu", host_ranks)
                if graph is not before:  # node data prepared in the old order no longer fits
                    prep = None
        if choice is not None and comm.rank == 0 and cfg.progress:
            print(choice.line, flush=True)
        stage = "prepare"
        with clock.phase("prepare"):
            if prep is None:
                prep = prepare_graph(graph, cfg.seed)
    except Exception as e:  # noqa: BLE001 - agreed on below, then re-raised or reported
        err = e
    try:
        comm.check(err)
    except (ValueError, OSError, LookupError, RankError) as e:
        msg = str(e) if type(e) in (RankError, ValueError) else f"{type(e).__name__}: {e}"
        if stage == "prepare":  # the file loaded: say what it lacks, not "cannot load"
            raise UserError(f"dataset {cfg.dataset!r} loaded ({graph.num_nodes} nodes, {graph.num_edges} edges) "
                            f"but cannot be trained on: {msg}") from e
        raise UserError(f"cannot load dataset {cfg.dataset!r}: {msg}") from e
    classes = agree_num_classes(share, cfg, comm)
    if classes is not None and classes > ASSUMED_CLASSES:  # the memory check assumed fewer
        check_fits(cfg, comm, classes, graph)
    return graph, with_num_classes(prep, classes)


def _node_order(cfg: TrainConfig, graph: Any, device: str, host_ranks: int = 1):
    """(graph in the order --reorder-nodes asks for, OrderChoice or None when nothing was
    weighed). ``auto`` (mgg.apps.node_order): a memory-mapped file keeps its order (relabelling
    would read it whole on every rank; mgg.prepare writes a local order into the file), a graph
    built in memory is tried with the cluster order, whose labels are the same on every device,
    so P ranks train the graph one rank trains. `host_ranks`: ranks on this host (each relabels
    its own copy)."""
    from .node_order import OrderChoice, apply_order, choose_order, input_order_is_local

    if cfg.reorder_nodes == "none":
        return graph, None
    if cfg.reorder_nodes != "auto":
        return apply_order(graph, cfg.reorder_nodes, device=device, processes=host_ranks)
    if getattr(graph, "mapped", False):
        if getattr(graph, "user_ids", None) is not None:
            return graph, OrderChoice("file", "auto: the file's order, relabelled by mgg.prepare")
        local, share, _ = input_order_is_local(graph)
        if local:
            return graph, None
        return graph, OrderChoice("none", f"auto: a memory-mapped file keeps its order, though {share:.0%} of its "
                                          f"edges cross 8 ranges; python -m mgg.prepare FILE --out NEW.npz tries "
                                          f"a local order", share=share)
    return choose_order(graph, device=device)


def _prepare_mapped(cfg: TrainConfig, comm, graph: Any) -> tuple[Any, Any]:
    """A memory-mapped graph: in full-graph mode each rank range-checks its share of `indices`
    and reads its own rows later (deferred prepare); other modes get the whole graph checked."""
    import dataclasses

    from ..data.prepare import prepare_graph
    from ..data.validate import check_index_share, validate_graph

    if cfg.mode == "full":
        check_index_share(graph, comm.rank, comm.size)
        return graph, prepare_graph(graph, cfg.seed, deferred=True)
    graph = validate_graph(dataclasses.replace(graph, mapped=False))
    return graph, prepare_graph(graph, cfg.seed)


def train(cfg: TrainConfig, comm, graph: Any, prepared=None, verbose: bool = False, stop=None,
          clock=None) -> TrainResult:
    """Train as `cfg.mode` asks (full-graph or sampled); collective, the same metrics on all ranks.
    See mgg.apps.full.train_full and mgg.apps.sampled.train_sampled. With `cfg.tf32`, float32
    matrix products run on TF32 tensor cores while it trains (torch's "high" matmul precision,
    restored after)."""
    if cfg.mode not in MODES:
        raise UserError(f"mode must be one of {MODES}, got {cfg.mode!r}")
    with matmul_precision(cfg.tf32):
        if cfg.mode == "sampled":
            from .sampled import train_sampled

            return train_sampled(cfg, comm, graph, prepared, verbose=verbose, stop=stop, clock=clock)
        from .full import train_full

        return train_full(cfg, comm, graph, prepared, verbose=verbose, stop=stop, clock=clock)


@contextlib.contextmanager
def matmul_precision(tf32: bool):
    """float32 matmuls on TF32 tensor cores inside the block when `tf32` (torch's "high"
    precision: inputs rounded to 10 mantissa bits, float32 sums), the previous setting after."""
    if not tf32:
        yield
        return
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def check_backend(backend: str, comm=None) -> None:
    """UserError (one line, exit 2 on every rank) when `--backend gpu` cannot run: no GPU, or a GPU
    package missing (and how to install it) on any rank, or ranks that would share a GPU (more
    ranks than GPUs on a host; mgg.runtime.gpu_assignment). Collective when `comm` is given:
    every rank's findings are gathered, so all ranks fail together with the same message."""
    if backend != "gpu":
        return
    from ..graph.backends import gpu_unavailable_reason
    from ..runtime.gpu_assignment import check_gpu_assignment

    why = gpu_unavailable_reason()
    whys = [why] if comm is None or comm.size == 1 else comm.allgather(why)
    if any(whys):
        bad = next(r for r, w in enumerate(whys) if w)
        where = "" if all(w == whys[0] for w in whys) else f"rank {bad}: "  # the same everywhere: say it once
        raise UserError(f"--backend gpu: {where}{whys[bad]}")
    problem = "" if comm is None else check_gpu_assignment(comm)
    if problem:
        raise UserError(f"--backend gpu: {problem}")


def check_storage_variant(cfg: TrainConfig) -> None:
    """UserError (exit 2) when a 16-bit --storage-dtype meets a GPU --variant without 16-bit
    kernels on a run that resolves to the GPU (--backend auto; --backend gpu is refused by argparse)."""
    if cfg.storage_dtype == "fp32" or cfg.variant == "auto":
        return
    from ..kernels.variants import storage_dtype_problem
    from ..graph.backends import resolve_backend

    problem = storage_dtype_problem(cfg.variant, cfg.storage_dtype)
    if problem and resolve_backend(cfg.backend) == "gpu":
        raise UserError(problem)


def check_fits(cfg: TrainConfig, comm, classes: int = 0, graph: Any = None) -> None:
    """UserError when the run's memory estimate does not fit this node's host memory or its GPU
    (mgg.apps.memory_check; `classes`: the model's outputs once the labels are read, 0: the
    estimate's assumption; `graph`: the loaded graph, whose size is used when the dataset's cannot
    be read from its name or file); skipped with --force. Every rank computes the same answer."""
    if cfg.force:
        return
    from ..graph.backends import resolve_backend
    from .memory_check import GraphSize, check_memory

    r = cfg.resolved()
    gpu = resolve_backend(cfg.backend) == "gpu"
    gpu_free = None
    if gpu:
        import torch

        from ..runtime.gpu_assignment import device_index

        gpu_free = int(torch.cuda.mem_get_info(device_index(comm.local_rank, torch.cuda.device_count()))[0])
    nodes = comm.node_of_ranks()
    size = None if graph is None else GraphSize(graph.num_nodes, graph.num_edges, graph.num_features or 2)
    why = check_memory(cfg.dataset, cfg.scale, r.hidden, r.layers, comm.size, int((nodes == nodes[comm.rank]).sum()),
                       gpu, gpu_free, cfg.mode, classes or ASSUMED_CLASSES, size)
    if why:
        raise UserError(why)


def run(cfg: TrainConfig, comm) -> TrainResult:
    """Load (agreeing on errors), train, report on rank 0. Collective.

    SIGTERM/SIGINT/SIGUSR1 during training end it after the current epoch (`res.stopped`), with a
    checkpoint when `cfg.checkpoint_dir` is set.
    """
    from ..checkpoint import StopSignal
    from .config import check_model_support
    from .report import print_stopped, print_summary, write_metrics

    from .kernel_prebuild import extend_kernel_prebuild, kernel_summary, start_kernel_prebuild
    from .outputs import check_outputs
    from .phases import PhaseClock, mark_init, process_age_s

    check_model_support(cfg.model, cfg.mode, cfg.tune)  # before loading a large dataset for nothing
    check_outputs(cfg, comm)  # results are written after the last epoch: their paths are checked now
    # GPU runs: the run's kernels compile while the rest of init and the load run (a GPU the
    # checks below refuse leaves only background compilers, ended at exit)
    start_kernel_prebuild(cfg, comm)
    mark_init("kernel_prebuild")
    check_backend(cfg.backend, comm)
    mark_init("backend")  # GPU runs: the GPU packages imported and the GPU assignment checked
    check_storage_variant(cfg)
    check_fits(cfg, comm)
    mark_init("memory_check")  # GPU runs: the GPU's free memory read
    clock = PhaseClock(comm, show=cfg.progress)
    clock.add("init", process_age_s())
    graph, prep = load(cfg, comm, clock)
    extend_kernel_prebuild(cfg, comm, graph)  # the kernels the graph's size adds
    with StopSignal() as stop:
        res = train(cfg, comm, graph, prep, verbose=True, stop=stop, clock=clock)
    res.kernels = kernel_summary(cfg, comm)
    if comm.rank == 0:
        if res.stopped:
            print_stopped(res, cfg.epochs)
            return res
        print_summary(cfg, graph, res, comm.size)  # first: a failed write below keeps the results shown
        if cfg.metrics_json:
            try:
                write_metrics(cfg.metrics_json, cfg, graph, res)
            except OSError as e:  # checked before the run; the disk filled or the folder changed since
                raise UserError(f"--metrics-json {cfg.metrics_json}: cannot write it: {e}") from e
        if cfg.save_weights:
            save_weights(cfg, res)
    return res


def save_weights(cfg: TrainConfig, res: TrainResult) -> None:
    """Write the trained weights to cfg.save_weights (rank 0; mgg.apps.weights_file)."""
    from dataclasses import asdict

    from .weights_file import write_weights

    write_weights(cfg.save_weights, cfg.model, res.model.state_dict(), asdict(cfg.resolved()))
    print(f"weights written to {cfg.save_weights}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (console script `mgg-train`). Returns 0; exits 2 on user errors (printed once,
    by rank 0, under a launcher) and 128 + signal number (143 for SIGTERM, 130 for SIGINT) when a signal
    stopped the run after a checkpoint. A launch that cannot run as one job (torchrun, srun without an MPI
    plugin, ranks without an MPI library) exits 2 with the command to use."""
    from ..runtime.launch_env import LaunchError, launch_rank
    from .exits import exit_together, only_first_rank_prints, report_user_error
    from .phases import mark_init

    mark_init("imports", first=True)  # the interpreter and the app's imports
    try:
        with only_first_rank_prints(launch_rank() == 0):
            cfg = parse_args(argv)
    except SystemExit as e:  # argparse printed the error (or --help) on the first rank
        if e.code not in (0, None):
            exit_together(e.code)
        raise
    from ..runtime import abort_on_error, world
    from ..runtime.comm import mpi_env_defaults

    mpi_env_defaults()
    try:
        comm = world(program="mgg.train")
    except LaunchError as e:
        if e.first:
            sys.stderr.write(f"error: {e}\n")
            sys.stderr.flush()
        sys.exit(2)
    mark_init("mpi")  # the arguments and the communicator (MPI's initialisation)
    control = comm.comm.Dup() if comm.size > 1 else None  # for report_user_error only
    from .log_setup import install_log_handler

    install_log_handler(cfg.verbosity, comm.rank, comm.size)
    if cfg.watchdog_timeout > 0 and comm.size > 1:
        comm.start_watchdog(cfg.watchdog_timeout)
    message = None
    res = None
    with abort_on_error(comm, "mgg.train"):
        try:
            res = run(cfg, comm)
        except UserError as e:  # usually on every rank (agreed through comm.check)
            message = str(e)
    if comm.watchdog is not None:
        comm.watchdog.close()
    if message is not None:
        report_user_error(comm, control, message)
    if res is not None and res.stopped:
        sys.exit(128 + int(getattr(signal, res.stopped, signal.SIGTERM)))
    return 0
