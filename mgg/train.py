"""Full-graph node-classification training: `mpirun -np P python -m mgg.train [flags]`.

Every rank loads the same dataset, builds its part of the `DistGraph`, holds a replica of the
model and trains on its own node range; gradients are summed over ranks after each backward and
the loss is normalised by the *global* number of training nodes, so P ranks follow the 1-rank
run (dropout masks are drawn for the whole graph from an identically seeded generator).

`--tune` lets the runtime tuner (docs/tuner.md) pick ps/dist/wpb and the GPU kernel variant from
the aggregation time of the first training iterations; the answer is cached for the next run.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

__all__ = ["TrainConfig", "TrainResult", "UserError", "parse_args", "prepare_graph", "train",
           "run", "write_metrics", "main"]

MODEL_NAMES = ("gcn", "gin", "sage", "gat")
MODEL_KINDS = {"gcn": "gcn", "gin": "sum", "sage": "mean"}  # the aggregation kind of each model
BACKENDS = ("auto", "cpu", "gpu")
#: GPU kernel variants (mgg.kernels.gpu.VARIANTS, not imported here: it pulls in torch) + "auto"
VARIANTS = ("auto", "pipelined", "pipelined_2pass", "ptr", "halo", "nonpipelined", "paper", "paper_nbi")
TUNED_VARIANTS = ("pipelined", "ptr", "halo")  # what --tune compares on the GPU with --variant auto
KNOB_DEFAULTS = {"ps": 16, "dist": 4, "wpb": 4}  # --ps/--dist/--wpb when not given
DEFAULT_TUNE_CACHE = "~/.cache/mgg/tuning.json"
MODES = ("full", "sampled")
SAMPLED_MODELS = ("sage",)             # models of --mode sampled (mgg.nn.SAMPLED_MODELS)
DEFAULT_FANOUT = (25, 10)              # --fanout of --mode sampled (GraphSAGE's S1, S2)
DEFAULT_BATCH_SIZE = 1024
#: flags that only --mode sampled reads (TrainConfig field -> flag)
SAMPLED_FLAGS = {"fanout": "--fanout", "batch_size": "--batch-size", "reorder": "--reorder/--no-reorder",
                 "feature_memory_budget": "--feature-memory-budget", "sample_seed": "--sample-seed",
                 "prefetch": "--prefetch/--no-prefetch"}


class UserError(Exception):
    """A problem with the user's input that every rank agreed on (printed without a traceback)."""


@dataclass
class TrainConfig:
    """Training settings; None hyperparameters take the model's defaults (mgg.nn.MODEL_DEFAULTS)."""

    dataset: str = "default"
    scale: float = 1.0
    model: str = "gcn"
    hidden: int | None = None
    layers: int | None = None
    epochs: int = 200
    lr: float | None = None
    weight_decay: float | None = None
    dropout: float | None = None
    seed: int = 0
    ps: int | None = None                # None: KNOB_DEFAULTS, or tuned with --tune (given: pinned)
    dist: int | None = None
    wpb: int | None = None
    backend: str = "auto"
    variant: str = "auto"                # GPU kernel variant (the CPU ignores it)
    tune: bool = False                   # runtime tuner (docs/tuner.md)
    tune_cache: str | None = None        # None: DEFAULT_TUNE_CACHE; "" or "none": no cache
    tune_log: str | None = None          # tuning log for `python -m mgg.tune --report`
    metrics_json: str | None = None
    eval_every: int = 1
    progress: bool = True
    ps_inter: int | None = None          # ps of remote partitions on other nodes (None: ps)
    ranks_per_node: int | None = None    # node grouping override (None: from MPI shared memory)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0            # also at the last epoch and on SIGTERM (0: only those)
    resume: str | None = None            # a checkpoint file or folder, or "auto"
    watchdog_timeout: float = 600.0      # seconds a collective may take before the job aborts (0: off)
    # sampled mini-batch training (docs/sampling.md); None: the defaults below, in --mode sampled
    mode: str = "full"                   # "full" (full-graph) or "sampled" (mini-batches)
    fanout: tuple[int, ...] | None = None  # per-layer fanouts, hop from the seeds first (25, 10)
    batch_size: int | None = None        # seeds per batch and rank (1024)
    reorder: bool | None = None          # Match-Reorder the batches of an epoch (False)
    feature_memory_budget: int | None = None  # bytes per rank for the feature slice (0: unlimited)
    sample_seed: int | None = None       # seed of shuffling and sampling (None: seed)
    prefetch: bool | None = None         # prepare batch i+1 on a side stream during batch i (CUDA: on)

    def resolved(self) -> "TrainConfig":
        """A copy with every None hyperparameter replaced by the model's default (and, in sampled
        mode, the sampling defaults; the number of layers is then the number of fanouts)."""
        from .nn import MODEL_DEFAULTS

        d = MODEL_DEFAULTS[self.model]
        pick = lambda v, default: default if v is None else v  # noqa: E731
        out = replace(self, hidden=pick(self.hidden, d.hidden), layers=pick(self.layers, d.layers),
                      lr=pick(self.lr, d.lr), weight_decay=pick(self.weight_decay, d.weight_decay),
                      dropout=pick(self.dropout, d.dropout))
        if self.mode == "sampled":
            fanout = tuple(self.fanout) if self.fanout is not None else DEFAULT_FANOUT
            out = replace(out, fanout=fanout, layers=len(fanout),
                          batch_size=pick(self.batch_size, DEFAULT_BATCH_SIZE),
                          reorder=bool(self.reorder), feature_memory_budget=pick(self.feature_memory_budget, 0),
                          sample_seed=pick(self.sample_seed, self.seed))
        return out

    def knobs(self) -> dict[str, int]:
        """ps, dist, wpb in effect before any tuning (the given values or KNOB_DEFAULTS)."""
        return {k: KNOB_DEFAULTS[k] if getattr(self, k) is None else getattr(self, k) for k in KNOB_DEFAULTS}

    def pinned(self) -> dict[str, int]:
        """The knobs the user gave explicitly (with --tune these are not searched)."""
        return {k: getattr(self, k) for k in KNOB_DEFAULTS if getattr(self, k) is not None}


@dataclass
class TrainResult:
    """What `train` returns on every rank (metrics are global, identical on all ranks)."""

    model: Any
    epochs: list[dict] = field(default_factory=list)
    train_acc: float = float("nan")
    val_acc: float = float("nan")
    test_acc: float = float("nan")
    final_loss: float = float("nan")
    median_epoch_ms: float = float("nan")
    world_size: int = 1
    backend: str = "cpu"
    stopped: str = ""                  # signal name when a SIGTERM/SIGUSR1 ended the run early
    resumed_from: str | None = None    # checkpoint this run continued from
    start_epoch: int = 0               # epochs done before this run (from the checkpoint)
    checkpoint: str | None = None      # last checkpoint written
    tuner: dict = field(default_factory=dict)  # tuner state, saved in and restored from checkpoints
    tuning: dict = field(default_factory=dict)  # the configuration used and the tuner's summary
    mode: str = "full"
    sampling: dict = field(default_factory=dict)  # --mode sampled: loader settings and byte totals


# -- argument parsing ---------------------------------------------------------------------------
def _int_in(lo: int, hi: int | None = None):
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo or (hi is not None and v > hi):
            rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {v}")
        return v
    return conv


def _float_in(lo: float, hi: float, lo_open: bool, hi_open: bool, what: str):
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {what}, got {s}")
        return v
    return conv


def _fanout_list(s: str) -> tuple[int, ...]:
    """"25,10" -> (25, 10); every value a positive integer or -1 (all neighbors)."""
    parts = [p.strip() for p in s.split(",")]
    if not s.strip() or any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated fanouts such as 25,10, got {s!r}")
    out = []
    for i, p in enumerate(parts):
        try:
            v = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"fanout {p!r} (position {i + 1}) is not an integer; expected "
                                             f"comma-separated fanouts such as 25,10") from None
        if v < 1 and v != -1:
            raise argparse.ArgumentTypeError(f"fanout {v} (position {i + 1}) must be a positive integer or -1 "
                                             f"(all neighbors)")
        out.append(v)
    return tuple(out)


def _size(s: str) -> int:
    """Bytes with an optional K/M/G/T suffix (powers of 1024); 0 = unlimited."""
    from .sample.features import parse_size

    try:
        return parse_size(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mgg.train", description="Full-graph GNN training over mgg's distributed aggregation "
        "(launch with mpirun -np P; without mpirun it runs as one rank).")
    p.add_argument("--dataset", default="default",
                   help="dataset name (default, sbm, reddit-like, products-like, papers-like) or a path")
    p.add_argument("--scale", type=_float_in(0.0, 1.0, True, False, "in (0, 1]"), default=1.0,
                   help="size factor for generated datasets (0, 1]")
    p.add_argument("--model", choices=MODEL_NAMES, default=None,
                   help="model (default: gcn; sage with --mode sampled)")
    p.add_argument("--hidden", type=_int_in(1), default=None,
                   help="hidden width (model default; gat: width per head, 8 heads)")
    p.add_argument("--layers", type=_int_in(1, 64), default=None, help="number of layers (model default)")
    p.add_argument("--epochs", type=_int_in(1), default=200)
    p.add_argument("--lr", type=_float_in(0.0, math.inf, True, True, "> 0"), default=None)
    p.add_argument("--weight-decay", type=_float_in(0.0, math.inf, False, True, ">= 0"), default=None,
                   help="L2 weight decay (5e-4 for gcn/sage, 0 for gin)")
    p.add_argument("--dropout", type=_float_in(0.0, 1.0, False, True, "in [0, 1)"), default=None)
    p.add_argument("--seed", type=_int_in(0), default=0)
    p.add_argument("--ps", type=_int_in(1, 1024), default=None,
                   help="neighbor partition size [1, 1024] (default 16; with --tune: pins ps)")
    p.add_argument("--dist", type=_int_in(1, 16), default=None,
                   help="interleave distance [1, 16] (default 4; with --tune: pins dist)")
    p.add_argument("--wpb", type=_int_in(1, 32), default=None,
                   help="warps per block [1, 32] (default 4; with --tune: pins wpb)")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--variant", choices=VARIANTS, default="auto",
                   help="GPU kernel variant (docs/kernels.md; the CPU ignores it). With --tune: "
                   "'auto' lets the tuner compare pipelined, ptr and halo; any other pins it")
    p.add_argument("--metrics-json", default=None, metavar="PATH", help="write metrics as JSON (rank 0)")
    p.add_argument("--eval-every", type=_int_in(1), default=1, help="evaluate every N epochs (and the last)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    t = p.add_argument_group("runtime tuner (docs/tuner.md)")
    t.add_argument("--tune", action="store_true",
                   help="search ps/dist/wpb (and the GPU kernel variant) over the first training "
                   "iterations, timing their aggregations; --ps/--dist/--wpb/--variant given "
                   "explicitly stay fixed")
    t.add_argument("--tune-cache", default=None, metavar="PATH",
                   help=f"tuning cache (default {DEFAULT_TUNE_CACHE}; 'none': no cache): a run whose "
                   "graph, ranks, width, device and kernels are cached starts at the cached best "
                   "with zero search iterations")
    t.add_argument("--tune-log", default=None, metavar="PATH",
                   help="write the tuning log here (rank 0), for python -m mgg.tune --report PATH")
    g = p.add_argument_group("multi-node and reliability (docs/multinode.md)")
    g.add_argument("--ps-inter", type=_int_in(1, 1024), default=None,
                   help="partition size of remote neighbors on other nodes [1, 1024] (default: --ps)")
    g.add_argument("--ranks-per-node", type=_int_in(1), default=None,
                   help="group ranks into nodes of this size (default: ranks sharing memory; "
                   "e.g. mpirun -np 4 --ranks-per-node 2 simulates 2 nodes)")
    g.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="write checkpoints here (rank 0): every --checkpoint-every epochs, at the "
                   "end and on SIGTERM")
    g.add_argument("--checkpoint-every", type=_int_in(0), default=0, metavar="K",
                   help="checkpoint every K epochs (0: only at the end and on SIGTERM)")
    g.add_argument("--resume", nargs="?", const="auto", default=None, metavar="PATH|auto",
                   help="continue from a checkpoint file or folder; 'auto' (or no value): the "
                   "newest in --checkpoint-dir, starting fresh when there is none")
    g.add_argument("--watchdog-timeout", type=_float_in(0.0, math.inf, False, True, ">= 0"),
                   default=600.0, metavar="SECONDS",
                   help="abort the job when a collective waits longer than this (0: off)")
    s = p.add_argument_group("sampled mini-batch training (docs/sampling.md)")
    s.add_argument("--mode", choices=MODES, default="full",
                   help="full: full-graph training (default); sampled: neighbor-sampled mini-batches, "
                   "data-parallel over the ranks, evaluated with full-neighborhood inference")
    s.add_argument("--fanout", type=_fanout_list, default=None, metavar="F1,F2,...",
                   help="neighbors sampled per node and layer, hop from the seeds first (default "
                   f"{','.join(map(str, DEFAULT_FANOUT))}; -1: all); the number of layers is the number "
                   "of fanouts")
    s.add_argument("--batch-size", type=_int_in(1), default=None,
                   help=f"seed nodes per mini-batch and rank (default {DEFAULT_BATCH_SIZE})")
    s.add_argument("--reorder", action=argparse.BooleanOptionalAction, default=None,
                   help="Match-Reorder: sample an epoch's batches first and run them so that consecutive "
                   "ones share the most nodes, whose features are reused (default: off)")
    s.add_argument("--feature-memory-budget", type=_size, default=None, metavar="BYTES",
                   help="memory per rank (GPU) for its slice of the input features, e.g. 8G, 512M; "
                   "above it the features live in the zero-copy host tier (default 0: unlimited)")
    s.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="sample and gather batch i+1 on a side CUDA stream while batch i computes "
                   "(default: on with GPUs; no effect on the CPU)")
    s.add_argument("--sample-seed", type=_int_in(0), default=None,
                   help="seed of seed shuffling and neighbor sampling (default: --seed)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse CLI flags into a TrainConfig (argparse exits with status 2 on a bad value)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.resume == "auto" and not ns.checkpoint_dir:
        parser.error("--resume auto needs --checkpoint-dir")
    if ns.checkpoint_every and not ns.checkpoint_dir:
        parser.error("--checkpoint-every needs --checkpoint-dir")
    for flag in ("tune_cache", "tune_log"):
        if getattr(ns, flag) is not None and not ns.tune:
            parser.error(f"--{flag.replace('_', '-')} needs --tune")
    if ns.mode == "sampled":
        _check_sampled_flags(parser, ns)
    else:
        for key, flag in SAMPLED_FLAGS.items():
            if getattr(ns, key) is not None:
                parser.error(f"{flag} needs --mode sampled")
    if ns.model is None:
        ns.model = "sage" if ns.mode == "sampled" else "gcn"
    return TrainConfig(**vars(ns))


def _check_sampled_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Flags that --mode sampled does not combine with (argparse error, exit 2)."""
    if ns.model is not None and ns.model not in SAMPLED_MODELS:
        parser.error(f"--mode sampled supports --model {', '.join(SAMPLED_MODELS)} only, got --model {ns.model}")
    fanout = ns.fanout if ns.fanout is not None else DEFAULT_FANOUT
    if ns.layers is not None and ns.layers != len(fanout):
        given = "--fanout" if ns.fanout is not None else "the default --fanout"
        parser.error(f"--layers {ns.layers} conflicts with {given} {','.join(map(str, fanout))} "
                     f"({len(fanout)} layers): in --mode sampled the number of layers is the number of "
                     f"fanouts; drop --layers or give {ns.layers} fanouts")
    for key, flag in (("tune", "--tune"), ("checkpoint_dir", "--checkpoint-dir"), ("resume", "--resume")):
        if getattr(ns, key):
            parser.error(f"{flag} is not supported with --mode sampled yet")


# -- data ---------------------------------------------------------------------------------------
@dataclass
class _Prepared:
    """Global arrays the training loop needs (every rank holds the same ones)."""

    x: np.ndarray          # float32 [N, F]
    y: np.ndarray          # int64 [N]
    train: np.ndarray      # bool [N]
    val: np.ndarray        # bool [N]
    test: np.ndarray       # bool [N]
    num_classes: int


def prepare_graph(graph: Any, seed: int = 0) -> _Prepared:
    """Features, labels and masks of `graph`, filling what is missing.

    Missing features become [1, log(1 + in-degree)]; missing masks a seeded 60/20/20 split of the
    labelled nodes; unlabelled nodes (y == -1) are removed from every mask.
    Raises ValueError when the graph has no labels or no training nodes.
    """
    n = int(len(graph.indptr) - 1)
    if getattr(graph, "y", None) is None:
        raise ValueError(f"dataset {getattr(graph, 'name', '?')!r} has no labels (y); cannot train")
    y = np.asarray(graph.y, dtype=np.int64)
    if y.shape != (n,):
        raise ValueError(f"labels have shape {y.shape}, expected ({n},)")
    x = getattr(graph, "x", None)
    if x is None:
        deg = np.diff(np.asarray(graph.indptr)).astype(np.float32)
        x = np.stack([np.ones(n, np.float32), np.log1p(deg)], axis=1)
    x = np.ascontiguousarray(x, dtype=np.float32)
    masks = [getattr(graph, k, None) for k in ("train_mask", "val_mask", "test_mask")]
    if any(m is None for m in masks):
        labelled = np.flatnonzero(y >= 0)
        perm = labelled[np.random.default_rng(seed).permutation(len(labelled))]
        a, b = int(0.6 * len(perm)), int(0.8 * len(perm))
        masks = []
        for part in (perm[:a], perm[a:b], perm[b:]):
            m = np.zeros(n, dtype=bool)
            m[part] = True
            masks.append(m)
    # unlabelled nodes (y == -1) never count, whatever the masks say
    train_m, val_m, test_m = (np.asarray(m, dtype=bool) & (y >= 0) for m in masks)
    if not train_m.any():
        raise ValueError("dataset has no training nodes (train_mask is all False)")
    num_classes = int(getattr(graph, "num_classes", 0) or 0)
    num_classes = max(num_classes, int(y.max()) + 1 if n else 1, 1)
    return _Prepared(x, y, train_m, val_m, test_m, num_classes)


def _load(cfg: TrainConfig, comm) -> tuple[Any, _Prepared]:
    """Load and prepare the dataset on every rank; a user error on any rank -> UserError on all."""
    from .runtime import RankError

    graph = prep = None
    err: BaseException | None = None
    try:
        from .data import load_dataset

        graph = load_dataset(cfg.dataset, scale=cfg.scale, seed=cfg.seed)
        prep = prepare_graph(graph, cfg.seed)
    except Exception as e:  # noqa: BLE001 - agreed on below, then re-raised or reported
        err = e
    try:
        comm.check(err)
    except (ValueError, OSError, LookupError, RankError) as e:
        msg = str(e) if type(e) in (RankError, ValueError) else f"{type(e).__name__}: {e}"
        raise UserError(f"cannot load dataset {cfg.dataset!r}: {msg}") from e
    return graph, prep


# -- training -----------------------------------------------------------------------------------
def _counts(logits, y, masks) -> list[float]:
    """[correct, total] per mask, float."""
    pred = logits.argmax(dim=1)
    out: list[float] = []
    for m in masks:
        out += [float((pred[m] == y[m]).sum().item()), float(m.sum().item())]
    return out


def _accuracies(buf: np.ndarray, at: int) -> dict[str, float]:
    """train/val/test accuracy from the all-reduced [correct, total] pairs at buf[at:at + 6]."""
    accs = [buf[at + 2 * i] / buf[at + 1 + 2 * i] if buf[at + 1 + 2 * i] else float("nan") for i in range(3)]
    return dict(zip(("train_acc", "val_acc", "test_acc"), map(float, accs)))


def _build_distgraph(cfg: TrainConfig, comm, graph: Any):
    """Seed torch and numpy with cfg.seed and build the DistGraph (collective); --ranks-per-node
    applies to this build only (node-aware plans see the simulated nodes)."""
    import torch

    from .runtime import DistGraph, RuntimeConfig

    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    rcfg = RuntimeConfig(**cfg.knobs(), backend=cfg.backend, variant=cfg.variant, ps_inter=cfg.ps_inter)
    saved_rpn = comm.ranks_per_node
    if cfg.ranks_per_node:
        comm.ranks_per_node = cfg.ranks_per_node
    try:
        return DistGraph.build(graph, comm, rcfg)
    finally:
        comm.ranks_per_node = saved_rpn


def _local_data(dg, prep: "_Prepared"):
    """This rank's rows on dg.device: x float [n_local, F], y int64 [n_local], the train/val/test
    masks bool [n_local], and the global number of training nodes (float)."""
    import torch

    def local(a: np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(dg.local(a))).to(dg.device)

    return local(prep.x), local(prep.y), [local(m) for m in (prep.train, prep.val, prep.test)], float(prep.train.sum())


def _close_epoch(res: "TrainResult", rec: dict, last: dict, bar, stop_flag: float, epoch: int,
                 cfg: TrainConfig, stop) -> None:
    """Record the epoch, advance the progress bar, and set res.stopped when some rank was asked
    to stop (stop_flag is the all-reduced flag, so every rank decides alike)."""
    res.epochs.append(rec)
    if bar is not None:
        bar.set_postfix(loss=f"{rec['loss']:.4f}", train=f"{last['train_acc'] or 0:.3f}",
                        val=f"{last['val_acc'] or 0:.3f}", refresh=False)
        bar.update(1)
    if stop_flag > 0 and epoch < cfg.epochs:  # some rank got SIGTERM: all stop here
        res.stopped = (stop.name if stop is not None and stop.requested else "") or "SIGTERM"


def _finish(res: "TrainResult", bar, last: dict, times: list[float], dg, tuner) -> None:
    """Close the bar and fill the result's final metrics."""
    if bar is not None:
        bar.close()
    res.train_acc, res.val_acc, res.test_acc = last["train_acc"], last["val_acc"], last["test_acc"]
    res.final_loss = res.epochs[-1]["loss"]
    res.median_epoch_ms = float(statistics.median(times))
    res.tuning = _tuning_summary(dg, tuner)


def _progress(cfg: TrainConfig, comm, start: int = 0):
    from tqdm import tqdm

    show = cfg.progress and comm.rank == 0 and not os.environ.get("CI")
    # under mpirun stderr is a pipe: show the bar anyway (mpirun forwards it); alone, only on a TTY
    disable = (not show) or (None if comm.size == 1 else False)
    return tqdm(total=cfg.epochs, initial=start, desc=f"{cfg.model} x{comm.size}", unit="epoch",
                disable=disable, dynamic_ncols=True, leave=True)


FAULT_KINDS = ("raise", "exit", "kill", "sigterm", "hang")


def _parse_fault(spec: str | None) -> tuple[int, int, str] | None:
    """Test hook MGG_FAULT_INJECT="RANK:EPOCH[:KIND]" (docs/multinode.md): rank RANK fails in the
    middle of epoch EPOCH, after the forward pass and before the backward's collectives. KIND:
    raise (default; an exception), exit (os._exit(17), no MPI_Finalize), kill (SIGKILL, as
    `kill -9`), sigterm (SIGTERM to itself), hang (sleeps; its peers wait in a collective)."""
    if not spec:
        return None
    parts = spec.split(":")
    try:
        rank, epoch = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        rank = epoch = -1
    kind = parts[2] if len(parts) > 2 else "raise"
    if rank < 0 or epoch < 1 or len(parts) > 3 or kind not in FAULT_KINDS:
        raise UserError(f"MGG_FAULT_INJECT={spec!r}: expected RANK:EPOCH[:KIND] with RANK >= 0, "
                        f"EPOCH >= 1 and KIND one of {', '.join(FAULT_KINDS)}")
    return rank, epoch, kind


def _fault_point(fault: tuple[int, int, str] | None, rank: int, epoch: int) -> None:
    if fault is None or fault[:2] != (rank, epoch):
        return
    kind = fault[2]
    sys.stderr.write(f"mgg.train: MGG_FAULT_INJECT: rank {rank} injects '{kind}' in epoch {epoch}\n")
    sys.stderr.flush()
    if kind == "raise":
        raise RuntimeError(f"injected fault (MGG_FAULT_INJECT) on rank {rank} in epoch {epoch}")
    if kind == "exit":
        os._exit(17)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if kind == "hang":
        while True:
            time.sleep(3600)


def _resume_state(cfg: TrainConfig, comm, graph: Any):
    """(path, state) of the checkpoint `cfg.resume` names, None when there is none. Collective;
    an unusable checkpoint raises the same UserError on every rank."""
    from .checkpoint import CheckpointError, graph_fingerprint, load_for_resume

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


def _start_tuner(cfg: TrainConfig, dg, comm, graph: Any, width: int, state: dict | None):
    """The runtime tuner of a --tune run and the timer of its aggregations (None, None without
    --tune). Collective. `state`: the tuner state of the checkpoint resumed from."""
    if not cfg.tune:
        return None, None
    from .checkpoint import graph_fingerprint
    from .runtime import RankError
    from .runtime.tuner import AggregationTimer, AggregationTuner, SearchSpace

    if dg.backend != "gpu":
        variants = ("pipelined",)  # the CPU executor has one kernel
    else:
        variants = TUNED_VARIANTS if cfg.variant == "auto" else (cfg.variant,)
    pins = cfg.pinned()
    space = SearchSpace(**{f"{k}_values": (v,) for k, v in pins.items()}, variants=variants,
                        tune_ps_inter=False if cfg.ps_inter is not None else None)
    extra = ",".join(f"{k}={v}" for k, v in {**pins, "ps_inter": cfg.ps_inter}.items() if v is not None)
    cache = os.path.expanduser(cfg.tune_cache or DEFAULT_TUNE_CACHE)
    tuner = err = None
    try:
        tuner = AggregationTuner.for_distgraph(
            dg, dim=width, kinds=(MODEL_KINDS[cfg.model],), fingerprint=graph_fingerprint(graph),
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


@contextmanager
def _untimed(timer):
    """Aggregations inside are not counted by the tuner's timer (the eval forward)."""
    if timer is not None:
        timer.paused = True
    try:
        yield
    finally:
        if timer is not None:
            timer.paused = False


def _tuning_summary(dg, tuner) -> dict:
    """What the metrics JSON and the final line report: the configuration in effect and, with
    --tune, the tuner's summary (its best, search iterations, cache hit)."""
    p = dg.params
    doc = {"enabled": tuner is not None,
           "config": {"ps": p.ps, "dist": p.dist, "wpb": p.wpb, "ps_inter": p.ps_inter,
                      "variant": dg.config.variant}}
    if tuner is not None:
        doc.update(tuner.summary(), iterations=tuner.iterations)
    return doc


def train(cfg: TrainConfig, comm, graph: Any, prepared: _Prepared | None = None,
          verbose: bool = False, stop=None) -> TrainResult:
    """Train `cfg.model` on `graph` over `comm`; collective, returns the same metrics on all ranks.

    With `cfg.resume` it continues from a checkpoint (the losses then match the uninterrupted
    run); with `cfg.checkpoint_dir` it writes checkpoints. `stop` (a StopSignal) ends the run
    at the end of the epoch in which any rank got the signal, after a checkpoint.
    """
    import torch
    import torch.nn.functional as F

    from .checkpoint import CheckpointError, Checkpointer, capture_state, graph_fingerprint, restore_state
    from .nn import allreduce_gradients, broadcast_parameters, build_model

    if cfg.mode == "sampled":
        from .train_sampled import train_sampled

        return train_sampled(cfg, comm, graph, prepared, verbose=verbose, stop=stop)
    if cfg.mode != "full":
        raise UserError(f"mode must be one of {MODES}, got {cfg.mode!r}")
    cfg = cfg.resolved()
    fault = _parse_fault(os.environ.get("MGG_FAULT_INJECT"))
    resume = _resume_state(cfg, comm, graph)
    prep = prepared if prepared is not None else prepare_graph(graph, cfg.seed)
    dg = _build_distgraph(cfg, comm, graph)
    closing = False  # dg.close() is collective: only when every rank gets there
    timer = None
    try:
        dev = dg.device
        x, y, masks, n_train = _local_data(dg, prep)
        model = build_model(cfg.model, prep.x.shape[1], cfg.hidden, prep.num_classes, cfg.layers,
                            cfg.dropout).to(dev)
        broadcast_parameters(model, comm)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        gen = torch.Generator().manual_seed(cfg.seed + 1)  # dropout masks, same on every rank
        res = TrainResult(model=model, world_size=comm.size, backend=dg.backend)
        last = {"train_acc": None, "val_acc": None, "test_acc": None}
        start = 0
        if resume is not None:
            res.resumed_from, state = resume
            try:
                restore_state(state, model, opt, gen, res.resumed_from)
            except CheckpointError as e:  # the same on every rank: all hold rank 0's state
                raise UserError(f"cannot resume: {e}") from e
            res.start_epoch = start = int(state["epoch"])
            last, res.epochs, res.tuner = (dict(state["last_eval"]), list(state["history"]),
                                           dict(state["tuner"]))
        tuner, timer = _start_tuner(cfg, dg, comm, graph, max(prep.x.shape[1], cfg.hidden), res.tuner)
        ckpt = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, comm) if cfg.checkpoint_dir else None
        fingerprint = graph_fingerprint(graph) if ckpt else ""
        times: list[float] = []
        bar = _progress(cfg, comm, start) if verbose else None
        for epoch in range(start + 1, cfg.epochs + 1):
            model.train()
            comm.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            logits = model(x, dg, gen)
            tm = masks[0]
            loss = F.cross_entropy(logits[tm], y[tm], reduction="sum") / n_train
            _fault_point(fault, comm.rank, epoch)
            loss.backward()
            allreduce_gradients(model, comm)
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            comm.barrier()
            ms = (time.perf_counter() - t0) * 1e3
            times.append(ms)
            if tuner is not None:  # this iteration's aggregation time; the next config applies
                tuner.step(timer.lap())  # collective (max over ranks) while searching
                res.tuner = tuner.state_dict()
            # [loss, stop flag, correct/total per mask]: one all-reduce agrees on all of them
            stats = [float(loss.item()), float(bool(stop is not None and stop.requested))]
            do_eval = epoch % cfg.eval_every == 0 or epoch == cfg.epochs
            if do_eval:
                model.eval()
                with torch.no_grad(), _untimed(timer):
                    stats += _counts(model(x, dg, None), y, masks)
            buf = comm.allreduce_(np.asarray(stats, dtype=np.float64))
            if do_eval:
                last = _accuracies(buf, 2)
            rec = {"epoch": epoch, "loss": float(buf[0]), "train_acc": last["train_acc"],
                   "val_acc": last["val_acc"], "epoch_ms": ms}
            _close_epoch(res, rec, last, bar, buf[1], epoch, cfg, stop)
            if ckpt is not None and (ckpt.due(epoch) or res.stopped or epoch == cfg.epochs):
                why = res.stopped or ("end" if epoch == cfg.epochs else "periodic")
                try:
                    res.checkpoint = ckpt.save(lambda: capture_state(
                        epoch, model, opt, gen, history=res.epochs, last_eval=last, tuner=res.tuner,
                        config=asdict(cfg), fingerprint=fingerprint, world_size=comm.size, reason=why))
                except CheckpointError as e:
                    raise UserError(str(e)) from e
            if res.stopped:
                break
        _finish(res, bar, last, times, dg, tuner)
        if tuner is not None and cfg.tune_log and comm.rank == 0:
            tuner.write_log(cfg.tune_log)  # also when the search did not finish, or was cached
        closing = True
        return res
    except UserError:  # agreed on by every rank
        closing = True
        raise
    finally:
        if timer is not None:
            timer.close()
        if closing:  # after any other error the peers may be elsewhere: closing would hang
            dg.close()


def _json_safe(v: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_metrics(path: str, cfg: TrainConfig, graph: Any, res: TrainResult) -> None:
    """Write the metrics JSON atomically (tmp file in the same directory + os.replace)."""
    from .version import version

    cfg = cfg.resolved()
    doc = {
        "dataset": getattr(graph, "name", cfg.dataset) or cfg.dataset,
        "model": cfg.model,
        "world_size": res.world_size,
        "backend": res.backend,
        "num_nodes": int(len(graph.indptr) - 1),
        "num_edges": int(graph.indptr[-1]),
        "train_acc": res.train_acc,
        "val_acc": res.val_acc,
        "test_acc": res.test_acc,
        "final_loss": res.final_loss,
        "median_epoch_ms": res.median_epoch_ms,
        "epochs": res.epochs,
        "tuner": res.tuning,
        "mode": res.mode,
        "config": asdict(cfg),
        "version": version(),
    }
    if res.sampling:
        doc["sampling"] = res.sampling
    if hasattr(graph, "fingerprint"):
        doc["fingerprint"] = graph.fingerprint()
    from .atomic import atomic_write_json

    atomic_write_json(path, _json_safe(doc), indent=2)


def run(cfg: TrainConfig, comm) -> TrainResult:
    """Load (agreeing on errors), train, report on rank 0. Collective.

    SIGTERM/SIGUSR1 during training end it after the current epoch (`res.stopped`), with a
    checkpoint when `cfg.checkpoint_dir` is set.
    """
    from .checkpoint import StopSignal

    graph, prep = _load(cfg, comm)
    with StopSignal() as stop:
        res = train(cfg, comm, graph, prep, verbose=True, stop=stop)
    if comm.rank == 0:
        r = cfg.resolved()
        if res.resumed_from:
            print(f"resumed from {res.resumed_from} after epoch {res.start_epoch}")
        if res.stopped:
            saved = (f"checkpoint {res.checkpoint} written at epoch {res.epochs[-1]['epoch']}; continue "
                     f"with --resume auto" if res.checkpoint else "no --checkpoint-dir, nothing saved")
            sys.stderr.write(f"mgg.train: {res.stopped} received: stopped after epoch "
                             f"{res.epochs[-1]['epoch']} of {r.epochs}; {saved}\n")
            sys.stderr.flush()
            return res
        if cfg.metrics_json:
            write_metrics(cfg.metrics_json, cfg, graph, res)
        print(f"dataset={getattr(graph, 'name', cfg.dataset)} nodes={len(graph.indptr) - 1} "
              f"edges={int(graph.indptr[-1])} model={r.model} ranks={comm.size} backend={res.backend} "
              f"epochs={r.epochs}" + (f" mode={res.mode}" if res.mode != "full" else ""))
        print(f"train_acc={res.train_acc:.4f} val_acc={res.val_acc:.4f} test_acc={res.test_acc:.4f}")
        print(f"final_loss={res.final_loss:.6f} median_epoch_ms={res.median_epoch_ms:.3f}", flush=True)
        if res.sampling:
            from .train_sampled import sampling_line

            print(sampling_line(res.sampling), flush=True)
        print(_tuning_line(res.tuning), flush=True)
    return res


def _tuning_line(t: dict) -> str:
    """`config: ps=.. dist=.. wpb=.. variant=..` plus, with --tune, how it was found."""
    c = t["config"]
    line = f"ps={c['ps']} dist={c['dist']} wpb={c['wpb']}"
    if c.get("ps_inter") is not None:
        line += f" ps_inter={c['ps_inter']}"
    line += f" variant={c['variant']}"
    if not t.get("enabled"):
        return f"config: {line} (fixed)"
    state = "from cache" if t["from_cache"] else ("done" if t["done"] else "still searching")
    return f"tuner: {line} search_iterations={t['search_iterations']} ({state})"


def _exit_together(code) -> None:
    """Exit with `code` after every rank got here (a bad flag is bad on all of them): without the
    barrier the launcher would kill the other ranks before they print the error."""
    sys.stderr.flush()
    launched = any(os.environ.get(k, "1") != "1" for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                                            "SLURM_NTASKS"))
    if launched:
        try:
            os.environ.setdefault("OMPI_MCA_osc", "^ucx")
            from mpi4py import MPI

            MPI.COMM_WORLD.Barrier()
        except ImportError:
            pass
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (console script `mgg-train`). Returns 0; exits 2 on user errors and
    128 + signal number (143 for SIGTERM) when a signal stopped the run after a checkpoint."""
    try:
        cfg = parse_args(argv)
    except SystemExit as e:  # argparse printed the error (or --help) on this rank
        if e.code not in (0, None):
            _exit_together(e.code)
        raise
    # Open MPI 5's UCX one-sided component prints an error and falls back on hosts without UCX
    # transports; the RDMA/shared-memory components serve the CPU path.
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    from .runtime import abort_on_error, world

    comm = world()
    if cfg.watchdog_timeout > 0 and comm.size > 1:
        comm.start_watchdog(cfg.watchdog_timeout)
    message = None
    res = None
    with abort_on_error(comm, "mgg.train"):
        try:
            res = run(cfg, comm)
        except UserError as e:  # every rank raised it (agreed through comm.check)
            message = str(e)
    if comm.watchdog is not None:
        comm.watchdog.close()
    if message is not None:
        where = f" (rank {comm.rank} of {comm.size})" if comm.size > 1 else ""
        sys.stderr.write(f"error{where}: {message}\n")
        sys.stderr.flush()
        sys.exit(2)
    if res is not None and res.stopped:
        sys.exit(128 + int(getattr(signal, res.stopped, signal.SIGTERM)))
    return 0


if __name__ == "__main__":
    main()
