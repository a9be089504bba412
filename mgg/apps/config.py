"""Settings and results of a training run: TrainConfig, TrainResult, UserError and the names the
CLI offers (backends, kernel variants, modes). Models and what they support come from the model
registry (mgg.nn.registry), not from a list here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..kernels.variants import tuned_variant_names, variant_names
from ..knobs import BACKENDS, KNOB_DEFAULTS, KNOB_MEANINGS, KNOB_RANGES, STORAGE_DTYPE_NAMES
from .common_settings import (backend_setting, force_setting, ranks_per_node_setting, reorder_nodes_setting,
                              scale_setting, seed_setting, undirected_setting)
from .flag_spec import Flag, FloatRange, IntRange, fanout_list, per_run_fields, sampled_only_flags, setting, size

__all__ = ["TrainConfig", "TrainResult", "UserError", "BACKENDS", "VARIANTS", "TUNED_VARIANTS", "tune_variants",
           "KNOB_DEFAULTS", "DEFAULT_TUNE_CACHE", "MODES", "DEFAULT_FANOUT", "DEFAULT_BATCH_SIZE", "SAMPLED_FLAGS",
           "PER_RUN_KEYS",
           "model_names", "sampled_models", "check_model_support", "STORAGE_DTYPES"]

#: GPU kernel variants (the registry mgg.kernels.variants, cheap to import) + "auto"
VARIANTS = ("auto", *variant_names())
TUNED_VARIANTS = tuned_variant_names()  # what --tune compares on the GPU with --variant auto
DEFAULT_TUNE_CACHE = "~/.cache/mgg/tuning.json"
MODES = ("full", "sampled")
STORAGE_DTYPES = STORAGE_DTYPE_NAMES  # --storage-dtype choices (mgg.knobs; fp32 first, the default)
DEFAULT_FANOUT = (25, 10)              # --fanout of --mode sampled (GraphSAGE's S1, S2)
DEFAULT_BATCH_SIZE = 1024


class UserError(Exception):
    """A problem with the user's input that every rank agreed on (printed without a traceback)."""


def model_names() -> tuple[str, ...]:
    """The --model choices: every registered model (mgg.nn.registry)."""
    from ..nn.registry import model_names as names

    return names()


def sampled_models() -> tuple[str, ...]:
    """The models --mode sampled trains (registry entries with a sampled model)."""
    from ..nn.registry import sampled_models as names

    return names()


def check_model_support(model: str, mode: str, tune: bool) -> None:
    """UserError when the registry says `model` cannot run as asked: an unknown name, --tune for a
    model whose aggregation the tuner does not time, or --mode sampled without a sampled model."""
    from ..nn.registry import model_entry

    try:
        entry = model_entry(model)
    except ValueError as e:
        raise UserError(str(e)) from None
    if tune and not entry.supports_tune:
        from ..nn.registry import tunable_models

        raise UserError(f"--tune does not apply to --model {model}: its aggregation does not run through the "
                        f"tuned plan (--tune supports --model {', '.join(tunable_models())})")
    if mode == "sampled" and not entry.supports_sampled:
        raise UserError(f"--mode sampled supports --model {', '.join(sampled_models())} only, got {model!r}")


def _dataset_help() -> str:
    from ..data.registry import DATASET_NAMES, DEFAULT_DATASET

    return (f"dataset name ({', '.join(DATASET_NAMES)}; default is {DEFAULT_DATASET}, the embedded karate club) "
            f"or a path")


def _model_defaults(name: str) -> Callable[[], str]:
    """A help text: the hyperparameter's default per registered model ('gcn 0.01, gin 0.01, ...')."""
    def text() -> str:
        from ..nn.registry import model_entry

        return ", ".join(f"{m} {getattr(model_entry(m).defaults, name):g}" for m in model_names())
    return text


def _knob_flag(name: str, default_text: str, **kw) -> Flag:
    """--ps/--dist/--wpb/--ps-inter: meaning and range from mgg.knobs (the runtime checks the same)."""
    lo, hi = KNOB_RANGES[name]
    return Flag(f"--{name.replace('_', '-')}", type=IntRange(lo, hi),
                help=f"{KNOB_MEANINGS[name]} [{{lo}}, {{hi}}] ({default_text})", **kw)


_TUNER = "runtime tuner (docs/tuner.md)"
_RELIABILITY = "multi-node and reliability (docs/multinode.md)"
_SAMPLED = "sampled mini-batch training (docs/sampling.md)"
_OUTPUTS = "outputs and run records"


@dataclass
class TrainConfig:
    """Training settings, each field with the flag(s) of `python -m mgg.train` that set it
    (mgg.apps.flag_spec: the parser is built from these fields). None hyperparameters take the
    model's defaults (mgg.nn.MODEL_DEFAULTS); None sampling settings the defaults of --mode sampled."""

    # -- training ---------------------------------------------------------------------------------
    dataset: str = setting("default", Flag("--dataset", help=_dataset_help))
    scale: float = scale_setting(
        type=FloatRange(0.0, 1.0, True, False, "in (0, 1]"), parser_default=None,
        help="size factor (0, 1] of a generated dataset (default {default:g}; refused with a file and with karate)")
    undirected: bool = undirected_setting(
        help="symmetrise the dataset as it is loaded: every edge in both directions, duplicates removed (for "
        "graphs stored directed, e.g. ogbn-arxiv); the graph is then held in memory")
    model: str = setting("gcn", Flag("--model", choices=model_names, default=None,
                                     help="model (default: {default}; sage with --mode sampled)"))
    hidden: int | None = setting(None, Flag("--hidden", type=IntRange(1),
                                            help="hidden width (model default; gat: width per head, 8 heads)"))
    layers: int | None = setting(None, Flag("--layers", type=IntRange(1, 64), help="number of layers (model default)"))
    epochs: int = setting(200, Flag("--epochs", type=IntRange(1),
                                    help="training epochs (default {default}, full-graph and --mode sampled alike)"))
    lr: float | None = setting(None, Flag(
        "--lr", type=FloatRange(0.0, math.inf, True, True, "> 0"),
        help=lambda: f"Adam learning rate (model default: {_model_defaults('lr')()})"))
    weight_decay: float | None = setting(None, Flag(
        "--weight-decay", type=FloatRange(0.0, math.inf, False, True, ">= 0"),
        help=lambda: f"L2 weight decay (model default: {_model_defaults('weight_decay')()})"))
    dropout: float | None = setting(None, Flag(
        "--dropout", type=FloatRange(0.0, 1.0, False, True, "in [0, 1)"),
        help=lambda: f"dropout before every layer (model default: {_model_defaults('dropout')()}); the mask is "
        "the same whatever the number of ranks"))
    norm: str | None = setting(None, Flag(
        "--norm", choices=("batch", "layer", "none"),
        help="normalisation in GIN's MLP (default batch: statistics over all ranks); gin only"))
    seed: int = seed_setting(type=IntRange(0),
                             help="seed of weights, dropout, generated datasets and splits (default {default})")
    num_classes: int | None = setting(None, Flag(
        "--num-classes", type=IntRange(1), metavar="C",
        help="classes of the model's output; every label must be below C (-1: unlabelled). Default: max(y) + 1, "
        "refused when that leaves more than max(16, D) classes without a node (D: distinct labels; a stray "
        "large label): give C to train that many anyway"))
    metrics_json: str | None = setting(None, Flag("--metrics-json", metavar="PATH",
                                                  help="write metrics as JSON (rank 0)"), per_run=True)
    eval_every: int = setting(1, Flag("--eval-every", type=IntRange(1), help="evaluate every N epochs (and the last)"))
    progress: bool = setting(True, Flag("--no-progress", action="store_false", help="no progress bar or phase lines"),
                             per_run=True)
    force: bool = force_setting(help="train even when the memory estimate says the run does not fit")
    # -- how the graph is laid out and aggregated: partitioning, kernels, storage, profiling ------
    reorder_nodes: str = reorder_nodes_setting(
        help="relabel the nodes before partitioning (docs/partition.md). auto (default): a graph built in memory "
        "(a preset, an edge list) whose order has no locality gets the cluster order when it cuts the remote "
        "rows, the same for every P; a memory-mapped .npz keeps its order (mgg.prepare writes a local one); "
        "none: the input order; metis needs pymetis")
    # ps/dist/wpb None: KNOB_DEFAULTS, or tuned with --tune (given: pinned)
    ps: int | None = setting(None, _knob_flag("ps", f"default {KNOB_DEFAULTS['ps']}; with --tune: pins ps"))
    dist: int | None = setting(None, _knob_flag("dist", f"default {KNOB_DEFAULTS['dist']}; with --tune: pins dist"))
    wpb: int | None = setting(None, _knob_flag("wpb", f"default {KNOB_DEFAULTS['wpb']}; with --tune: pins wpb"))
    backend: str = backend_setting(
        help="auto (default: gpu when CUDA and the gpu extra are usable, else cpu), cpu or gpu")
    variant: str = setting("auto", Flag(
        "--variant", choices=VARIANTS,
        help="GPU kernel variant (docs/kernels.md; the CPU ignores it). With --tune: 'auto' lets the tuner "
        "compare pipelined, ptr and halo; any other pins it"))
    storage_dtype: str = setting("fp32", Flag(
        "--storage-dtype", choices=STORAGE_DTYPES,
        help="element type of embeddings in the symmetric store and halo buffers (and of gradient rows in the "
        "backward); sums stay float32, parameters and their gradients float32 (docs/storage-dtype.md; "
        "default {default})"))
    tf32: bool = setting(False, Flag(
        "--tf32", action="store_true",
        help="float32 matrix products (the models' Linear layers) on the GPU's TF32 tensor cores: inputs rounded "
        "to 10 mantissa bits, sums in float32; about 2x faster GEMMs at GIN's sizes (docs/storage-dtype.md, "
        "'TF32 matrix products'). Default off: IEEE float32, as torch"))
    input_cache: bool = setting(True, Flag(
        "--no-input-cache", action="store_false",
        help="aggregate the input in the first layer every step, instead of once (its aggregation of the "
        "features is kept, float32 [nodes, F] per rank, and reused by every forward without input dropout: "
        "--dropout 0, and the evaluations); the results are the same up to float rounding"))
    row_sets: bool = setting(True, Flag(
        "--no-row-sets", action="store_false",
        help="compute every layer over every row, instead of only the rows the loss or the evaluation reads "
        "and their in-neighbours (row sets, used while a set holds <= 50%% of the nodes; docs/e2e.md); the "
        "results are the same"))
    cuda_graph: bool | None = setting(None, Flag(
        "--cuda-graph", action="bool",
        help="GPU: capture the training step in a CUDA graph and replay it (the step's kernel launches cost the "
        "host as much time as the GPU takes; dropout seeds then live on the GPU). Full-graph mode captures "
        "after two eager epochs; sampled mode (sage, gcn) after four eager steps, over batches padded to "
        "fixed capacities. Default: on where it applies (the GPU backend, without --tune or --profile-steps, "
        "or as the checkpoint resumed from was written); --no-cuda-graph runs every step eagerly. A step that "
        "cannot be captured runs eagerly, with the reason in the metrics"))
    profile_steps: bool = setting(False, Flag(
        "--profile-steps", action="store_true",
        help="time the parts of every training step (forward, backward, aggregations, gradient all-reduce, "
        "optimizer; CUDA events on the GPU) and put the medians in the metrics JSON (step_profile_ms); "
        "full-graph mode"))
    # -- the runtime tuner ------------------------------------------------------------------------
    tune: bool = setting(False, Flag(
        "--tune", action="store_true", group=_TUNER,
        help="search ps/dist/wpb (and the GPU kernel variant) over the first training iterations, timing their "
        "aggregations; --ps/--dist/--wpb/--variant given explicitly stay fixed"))
    tune_cache: str | None = setting(None, Flag(   # None: DEFAULT_TUNE_CACHE; "" or "none": no cache
        "--tune-cache", metavar="PATH", group=_TUNER,
        help=f"tuning cache (default {DEFAULT_TUNE_CACHE}; 'none': no cache): a run whose graph, ranks, width, "
        "device and kernels are cached starts at the cached best with zero search iterations"))
    tune_log: str | None = setting(None, Flag(
        "--tune-log", metavar="PATH", group=_TUNER,
        help="write the tuning log here (rank 0), for python -m mgg.tune --report PATH"), per_run=True)
    # -- multi-node and reliability ---------------------------------------------------------------
    ps_inter: int | None = setting(None, _knob_flag("ps_inter", "default: --ps", group=_RELIABILITY))
    ranks_per_node: int | None = ranks_per_node_setting(   # None: from MPI shared memory
        type=IntRange(1), group=_RELIABILITY,
        help="group ranks into nodes of this size (default: ranks sharing memory; e.g. mpirun -np 4 "
        "--ranks-per-node 2 simulates 2 nodes)")
    checkpoint_dir: str | None = setting(None, Flag(
        "--checkpoint-dir", metavar="DIR", group=_RELIABILITY,
        help="write checkpoints here (rank 0): every --checkpoint-every epochs, at the end and on SIGTERM"),
        per_run=True)
    checkpoint_every: int = setting(0, Flag(
        "--checkpoint-every", type=IntRange(0), metavar="K", group=_RELIABILITY,
        help="checkpoint every K epochs (0: only at the end and on SIGTERM)"), per_run=True)
    resume: str | None = setting(None, Flag(
        "--resume", nargs="?", const="auto", metavar="PATH|auto", group=_RELIABILITY,
        help="continue from a checkpoint file or folder; 'auto' (or no value): the newest in --checkpoint-dir, "
        "starting fresh when there is none"), per_run=True)
    watchdog_timeout: float = setting(600.0, Flag(
        "--watchdog-timeout", type=FloatRange(0.0, math.inf, False, True, ">= 0"), metavar="SECONDS",
        group=_RELIABILITY, help="abort the job when a collective waits longer than this (0: off)"))
    # -- sampled mini-batch training; None: the defaults of --mode sampled --------------------------
    mode: str = setting("full", Flag(
        "--mode", choices=MODES, group=_SAMPLED,
        help="full: full-graph training (default); sampled: neighbor-sampled mini-batches, data-parallel over "
        "the ranks, evaluated with full-neighborhood inference"))
    fanout: tuple[int, ...] | None = setting(None, Flag(
        "--fanout", type=fanout_list, metavar="F1,F2,...", group=_SAMPLED,
        help=f"neighbors sampled per node and layer, hop from the seeds first (default "
        f"{','.join(map(str, DEFAULT_FANOUT))}; -1: all); the number of layers is the number of fanouts"),
        sampled_only=True)
    batch_size: int | None = setting(None, Flag(
        "--batch-size", type=IntRange(1), group=_SAMPLED,
        help=f"seed nodes per mini-batch and rank: a step trains on a global batch of P x this many, its loss "
        f"the mean over them (default {DEFAULT_BATCH_SIZE}, capped at ceil(training nodes / P); a larger value "
        f"is refused)"), sampled_only=True)
    reorder: bool | None = setting(None, Flag(
        "--reorder", action="bool", group=_SAMPLED,
        help="Match-Reorder: sample an epoch's batches first and run them so that consecutive ones share the "
        "most nodes, whose features are reused (default: off)"), sampled_only=True)
    feature_memory_budget: int | None = setting(None, Flag(
        "--feature-memory-budget", type=size, metavar="BYTES", group=_SAMPLED,
        help="memory per rank (GPU) for its slice of the input features, e.g. 8G, 512M; above it the features "
        "live in the zero-copy host tier (default 0: unlimited)"), sampled_only=True)
    prefetch: bool | None = setting(None, Flag(
        "--prefetch", action="bool", group=_SAMPLED,
        help="sample and gather batch i+1 on a side CUDA stream while batch i computes (default: on with GPUs; "
        "no effect on the CPU)"), sampled_only=True)
    sample_seed: int | None = setting(None, Flag(
        "--sample-seed", type=IntRange(0), group=_SAMPLED,
        help="seed of seed shuffling and neighbor sampling (default: --seed)"), sampled_only=True)
    # -- outputs and run records (mgg.apps.weights_file, mgg.apps.run_log, mgg.apps.config_file) ---
    save_weights: str | None = setting(None, Flag(
        "--save-weights", metavar="PATH", group=_OUTPUTS,
        help="at the end, write the trained weights under PyTorch Geometric's parameter names (rank 0): "
        "PATH.safetensors, or torch.save for any other name (torch.load(PATH) gives the state dict; its "
        "description in PATH.json); read by python -m mgg.predict"), per_run=True)
    log_jsonl: str | None = setting(None, Flag(
        "--log-jsonl", metavar="PATH", group=_OUTPUTS,
        help="per-epoch records as JSON lines, written as the epochs happen (rank 0; a start line with the "
        "config, one line an epoch, an end line; appended to with --resume)"), per_run=True)
    tensorboard: str | None = setting(None, Flag(
        "--tensorboard", metavar="DIR", group=_OUTPUTS,
        help="per-epoch scalars for TensorBoard (torch.utils.tensorboard; needs pip install tensorboard)"),
        per_run=True)
    config_file: str | None = setting(None, Flag(
        "--config", metavar="FILE", group=_OUTPUTS,
        help="start from the settings of an earlier run: its --metrics-json, its --log-jsonl, or a JSON object "
        "of settings; flags given here win (output paths are not carried over)"), per_run=True)
    verbosity: int = setting(0, Flag(   # -q: -1, default 0, -v: 1 (mgg.apps.log_setup)
        "-v", "--verbose", action="count", group=_OUTPUTS, exclusive=True,
        help="more messages: -v shows the tuner's and the loaders' debug lines"), Flag(
        "-q", "--quiet", action="store_const", const=-1, group=_OUTPUTS, exclusive=True,
        help="only warnings, errors and the final summary (no progress, no phase lines)"), per_run=True)

    def resolved(self) -> "TrainConfig":
        """A copy with every None hyperparameter replaced by the model's default (and, in sampled
        mode, the sampling defaults; the number of layers is then the number of fanouts)."""
        from ..nn import MODEL_DEFAULTS

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


#: flags that only --mode sampled reads (TrainConfig field -> flag), from the fields' declarations
SAMPLED_FLAGS = sampled_only_flags(TrainConfig)
#: TrainConfig fields a --config file does not carry over: each run's own files and presentation
PER_RUN_KEYS = per_run_fields(TrainConfig)


def tune_variants(cfg: TrainConfig, backend: str) -> tuple[str, ...]:
    """The kernel variants a --tune run of `cfg` compares on `backend` (the CPU executor has one)."""
    if backend != "gpu":
        return ("pipelined",)
    variants = TUNED_VARIANTS if cfg.variant == "auto" else (cfg.variant,)
    if cfg.storage_dtype != "fp32":  # only the variants with 16-bit kernels
        from ..kernels.variants import variants_for_storage

        variants = variants_for_storage(cfg.storage_dtype, variants) or variants
    return tuple(variants)


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
    phases: dict = field(default_factory=dict)    # startup phase -> seconds, max over ranks (mgg.apps.phases)
    phase_peaks_mb: dict = field(default_factory=dict)  # phase -> {"host", "gpu"} peak MiB so far at its end
    init_parts_s: dict = field(default_factory=dict)    # init step -> seconds, max over ranks (mgg.apps.phases)
    time_to_first_epoch_s: float | None = None    # process start to the end of the first epoch (max over ranks)
    memory: dict = field(default_factory=dict)    # per-rank host/GPU peaks (mgg.apps.memory_report)
    step_profile: dict = field(default_factory=dict)  # --profile-steps: ms per part of a step
    cuda_graph: str = ""               # --cuda-graph: "replayed", or "eager: <why>"
    row_sets: dict = field(default_factory=dict)  # row set name -> nodes over all ranks (mgg.runtime.rowset)
    plans: dict = field(default_factory=dict)     # direction -> plan figures, max / sum over ranks (mgg.apps.plan_summary)
    kernels: dict = field(default_factory=dict)   # GPU runs: kernel modules built, loaded (mgg.apps.kernel_prebuild)
