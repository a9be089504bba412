"""The training command line's flags: argument types, the parser, and `parse_args` -> TrainConfig
(argparse errors, exit 2, for flags that do not combine). mgg.apps.cli runs what they ask for."""
from __future__ import annotations

import argparse
import math
import os
from typing import Sequence

from .args_output import add_output_args, check_output_args
from .config_file import with_config_file
from .config import (BACKENDS, DEFAULT_BATCH_SIZE, DEFAULT_FANOUT, DEFAULT_TUNE_CACHE, MODES, SAMPLED_FLAGS,
                     STORAGE_DTYPES, VARIANTS, TrainConfig, model_names, sampled_models)

__all__ = ["build_parser", "parse_args"]


# -- argument types -----------------------------------------------------------------------------
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
    from ..sample.features import parse_size

    try:
        return parse_size(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- the parser ---------------------------------------------------------------------------------
def _model_defaults(field: str) -> str:
    """'gcn 0.01, gin 0.01, ...': a hyperparameter's default per registered model, for --help."""
    from ..nn.registry import model_entry

    return ", ".join(f"{m} {getattr(model_entry(m).defaults, field):g}" for m in model_names())


def _add_training_args(p: argparse.ArgumentParser) -> None:
    from ..data.registry import DATASET_NAMES, DEFAULT_DATASET

    p.add_argument("--dataset", default="default",
                   help=f"dataset name ({', '.join(DATASET_NAMES)}; default is {DEFAULT_DATASET}, the embedded "
                        f"karate club) or a path")
    p.add_argument("--scale", type=_float_in(0.0, 1.0, True, False, "in (0, 1]"), default=None,
                   help="size factor (0, 1] of a generated dataset (default 1; refused with a file and with karate)")
    p.add_argument("--undirected", action="store_true",
                   help="symmetrise the dataset as it is loaded: every edge in both directions, duplicates "
                   "removed (for graphs stored directed, e.g. ogbn-arxiv); the graph is then held in memory")
    p.add_argument("--model", choices=model_names(), default=None,
                   help="model (default: gcn; sage with --mode sampled)")
    p.add_argument("--hidden", type=_int_in(1), default=None,
                   help="hidden width (model default; gat: width per head, 8 heads)")
    p.add_argument("--layers", type=_int_in(1, 64), default=None, help="number of layers (model default)")
    p.add_argument("--epochs", type=_int_in(1), default=200,
                   help="training epochs (default 200, full-graph and --mode sampled alike)")
    p.add_argument("--lr", type=_float_in(0.0, math.inf, True, True, "> 0"), default=None,
                   help=f"Adam learning rate (model default: {_model_defaults('lr')})")
    p.add_argument("--weight-decay", type=_float_in(0.0, math.inf, False, True, ">= 0"), default=None,
                   help=f"L2 weight decay (model default: {_model_defaults('weight_decay')})")
    p.add_argument("--dropout", type=_float_in(0.0, 1.0, False, True, "in [0, 1)"), default=None,
                   help=f"dropout before every layer (model default: {_model_defaults('dropout')}); the "
                   "mask is the same whatever the number of ranks")
    p.add_argument("--norm", choices=("batch", "layer", "none"), default=None,
                   help="normalisation in GIN's MLP (default batch: statistics over all ranks); gin only")
    p.add_argument("--seed", type=_int_in(0), default=0,
                   help="seed of weights, dropout, generated datasets and splits (default 0)")
    p.add_argument("--num-classes", type=_int_in(1), default=None, metavar="C",
                   help="classes of the model's output; every label must be below C (-1: unlabelled). "
                   "Default: max(y) + 1, refused when that leaves more than max(16, D) classes without a "
                   "node (D: distinct labels; a stray large label): give C to train that many anyway")
    p.add_argument("--metrics-json", default=None, metavar="PATH", help="write metrics as JSON (rank 0)")
    p.add_argument("--eval-every", type=_int_in(1), default=1, help="evaluate every N epochs (and the last)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar or phase lines")
    p.add_argument("--force", action="store_true",
                   help="train even when the memory estimate says the run does not fit")


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    """How the graph is laid out and aggregated: partitioning, kernels, storage, profiling."""
    p.add_argument("--reorder-nodes", choices=("auto", "none", "degree", "rcm", "cluster", "metis"), default="auto",
                   help="relabel the nodes before partitioning (docs/partition.md). auto (default): a graph "
                   "built in memory (a preset, an edge list) whose order has no locality gets the cluster order "
                   "when it cuts the remote rows, the same for every P; a memory-mapped .npz keeps its order "
                   "(mgg.prepare writes a local one); none: the input order; metis needs pymetis")
    p.add_argument("--ps", type=_int_in(1, 1024), default=None,
                   help="neighbor partition size [1, 1024] (default 16; with --tune: pins ps)")
    p.add_argument("--dist", type=_int_in(1, 16), default=None,
                   help="interleave distance [1, 16] (default 4; with --tune: pins dist)")
    p.add_argument("--wpb", type=_int_in(1, 32), default=None,
                   help="warps per block [1, 32] (default 4; with --tune: pins wpb)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto (default: gpu when CUDA and the gpu extra are usable, else cpu), cpu or gpu")
    p.add_argument("--variant", choices=VARIANTS, default="auto",
                   help="GPU kernel variant (docs/kernels.md; the CPU ignores it). With --tune: "
                   "'auto' lets the tuner compare pipelined, ptr and halo; any other pins it")
    p.add_argument("--storage-dtype", choices=STORAGE_DTYPES, default="fp32",
                   help="element type of embeddings in the symmetric store and halo buffers (and of "
                   "gradient rows in the backward); sums stay float32, parameters and their gradients "
                   "float32 (docs/storage-dtype.md; default fp32)")
    p.add_argument("--tf32", action="store_true",
                   help="float32 matrix products (the models' Linear layers) on the GPU's TF32 tensor cores: "
                   "inputs rounded to 10 mantissa bits, sums in float32; about 2x faster GEMMs at GIN's "
                   "sizes (docs/storage-dtype.md, 'TF32 matrix products'). Default off: IEEE float32, as torch")
    p.add_argument("--no-input-cache", dest="input_cache", action="store_false",
                   help="aggregate the input in the first layer every step, instead of once (its "
                   "aggregation of the features is kept, float32 [nodes, F] per rank, and reused by every "
                   "forward without input dropout: --dropout 0, and the evaluations); the results are the same "
                   "up to float rounding")
    p.add_argument("--no-row-sets", dest="row_sets", action="store_false",
                   help="compute every layer over every row, instead of only the rows the loss or the "
                   "evaluation reads and their in-neighbours (row sets, used while a set holds <= 50%% of "
                   "the nodes; docs/e2e.md); the results are the same")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="GPU, full-graph mode: capture the training step in a CUDA graph after two "
                   "eager epochs and replay it (the step's kernel launches cost the host as much time "
                   "as the GPU takes at P > 1; dropout seeds then live on the GPU). Default: on where "
                   "it applies (the GPU backend, full-graph mode, without --tune or --profile-steps, "
                   "or as the checkpoint resumed from was written); --no-cuda-graph runs every step "
                   "eagerly. A step that cannot be captured runs eagerly, with the reason in the metrics")
    p.add_argument("--profile-steps", action="store_true",
                   help="time the parts of every training step (forward, backward, aggregations, gradient "
                   "all-reduce, optimizer; CUDA events on the GPU) and put the medians in the metrics JSON "
                   "(step_profile_ms); full-graph mode")


def _add_tuner_args(p: argparse.ArgumentParser) -> None:
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


def _add_reliability_args(p: argparse.ArgumentParser) -> None:
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


def _add_sampled_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("sampled mini-batch training (docs/sampling.md)")
    s.add_argument("--mode", choices=MODES, default="full",
                   help="full: full-graph training (default); sampled: neighbor-sampled mini-batches, "
                   "data-parallel over the ranks, evaluated with full-neighborhood inference")
    s.add_argument("--fanout", type=_fanout_list, default=None, metavar="F1,F2,...",
                   help="neighbors sampled per node and layer, hop from the seeds first (default "
                   f"{','.join(map(str, DEFAULT_FANOUT))}; -1: all); the number of layers is the number "
                   "of fanouts")
    s.add_argument("--batch-size", type=_int_in(1), default=None,
                   help=f"seed nodes per mini-batch and rank: a step trains on a global batch of P x "
                   f"this many, its loss the mean over them (default {DEFAULT_BATCH_SIZE}, capped at "
                   f"ceil(training nodes / P); a larger value is refused)")
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


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are two lines: the error, and where the flags are listed (the
    full usage synopsis runs to 20 lines, which buried the error)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `python -m mgg.train` (--model choices: the model registry)."""
    p = _Parser(
        prog="mgg.train", description="Full-graph GNN training over mgg's distributed aggregation "
        "(launch with mpirun -np P; without mpirun it runs as one rank).")
    _add_training_args(p)
    _add_runtime_args(p)
    _add_tuner_args(p)
    _add_reliability_args(p)
    _add_sampled_args(p)
    add_output_args(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse CLI flags into a TrainConfig (argparse exits with status 2 on a bad value)."""
    import sys

    parser = build_parser()
    argv = with_config_file(build_parser, sys.argv[1:] if argv is None else argv)
    ns = parser.parse_args(argv)
    check_output_args(parser, ns)
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
    if ns.scale is not None and os.path.exists(ns.dataset):
        parser.error(f"--scale applies to generated datasets only; {ns.dataset} is a file "
                     f"(drop --scale, or make a smaller file)")
    if ns.scale is not None and ns.dataset.lower() in ("default", "karate"):
        parser.error(f"--scale applies to generated datasets only (sbm and the -like presets); --dataset "
                     f"{ns.dataset} is the fixed 34-node karate club (drop --scale, or pick --dataset sbm)")
    if ns.storage_dtype != "fp32":
        _check_storage_dtype(parser, ns)
    if ns.norm is not None and ns.model != "gin":
        parser.error(f"--norm applies to --model gin only, got --model {ns.model}")
    ns.scale = 1.0 if ns.scale is None else ns.scale
    return TrainConfig(**vars(ns))


def _check_storage_dtype(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """What a 16-bit --storage-dtype does not combine with (argparse error, exit 2): the sampled
    mode, models whose aggregation bypasses the plan (GAT's fused kernels), and GPU variants
    without 16-bit kernels."""
    flag = f"--storage-dtype {ns.storage_dtype}"
    if ns.mode != "full":
        parser.error(f"{flag} applies to --mode full only")
    from ..nn.registry import model_entry

    if model_entry(ns.model).aggregation is None:
        parser.error(f"{flag} is not implemented for --model {ns.model} (its fused aggregation keeps "
                     f"float32 rows); use --storage-dtype fp32")
    if ns.backend == "gpu" and ns.variant != "auto":
        from ..kernels.variants import storage_dtype_problem

        problem = storage_dtype_problem(ns.variant, ns.storage_dtype)
        if problem:
            parser.error(problem)


def _check_sampled_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Flags that --mode sampled does not combine with (argparse error, exit 2)."""
    supported = sampled_models()
    if ns.model is not None and ns.model not in supported:
        parser.error(f"--mode sampled supports --model {', '.join(supported)} only, got --model {ns.model}")
    fanout = ns.fanout if ns.fanout is not None else DEFAULT_FANOUT
    if ns.layers is not None and ns.layers != len(fanout):
        given = "--fanout" if ns.fanout is not None else "the default --fanout"
        parser.error(f"--layers {ns.layers} conflicts with {given} {','.join(map(str, fanout))} "
                     f"({len(fanout)} layers): in --mode sampled the number of layers is the number of "
                     f"fanouts; drop --layers or give {ns.layers} fanouts")
    for key, flag in (("tune", "--tune"), ("checkpoint_dir", "--checkpoint-dir"), ("resume", "--resume"),
                      ("profile_steps", "--profile-steps"), ("cuda_graph", "--cuda-graph")):
        if getattr(ns, key):
            parser.error(f"{flag} is not supported with --mode sampled yet")


