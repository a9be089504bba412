"""Settings and results of a training run: TrainConfig, TrainResult, UserError and the names the
CLI offers (backends, kernel variants, modes). Models and what they support come from the model
registry (mgg.nn.registry), not from a list here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..kernels.variants import tuned_variant_names, variant_names

__all__ = ["TrainConfig", "TrainResult", "UserError", "BACKENDS", "VARIANTS", "TUNED_VARIANTS", "tune_variants",
           "KNOB_DEFAULTS", "DEFAULT_TUNE_CACHE", "MODES", "DEFAULT_FANOUT", "DEFAULT_BATCH_SIZE", "SAMPLED_FLAGS",
           "model_names", "sampled_models", "check_model_support", "STORAGE_DTYPES"]

BACKENDS = ("auto", "cpu", "gpu")
#: GPU kernel variants (the registry mgg.kernels.variants, cheap to import) + "auto"
VARIANTS = ("auto", *variant_names())
TUNED_VARIANTS = tuned_variant_names()  # what --tune compares on the GPU with --variant auto
KNOB_DEFAULTS = {"ps": 16, "dist": 4, "wpb": 4}  # --ps/--dist/--wpb when not given
DEFAULT_TUNE_CACHE = "~/.cache/mgg/tuning.json"
MODES = ("full", "sampled")
#: --storage-dtype choices (mgg.runtime.store.STORAGE_DTYPES; fp32 first, the default)
STORAGE_DTYPES = ("fp32", "bf16", "fp16")
DEFAULT_FANOUT = (25, 10)              # --fanout of --mode sampled (GraphSAGE's S1, S2)
DEFAULT_BATCH_SIZE = 1024
#: flags that only --mode sampled reads (TrainConfig field -> flag)
SAMPLED_FLAGS = {"fanout": "--fanout", "batch_size": "--batch-size", "reorder": "--reorder/--no-reorder",
                 "feature_memory_budget": "--feature-memory-budget", "sample_seed": "--sample-seed",
                 "prefetch": "--prefetch/--no-prefetch"}


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


@dataclass
class TrainConfig:
    """Training settings; None hyperparameters take the model's defaults (mgg.nn.MODEL_DEFAULTS)."""

    dataset: str = "default"
    scale: float = 1.0
    undirected: bool = False             # symmetrise the dataset's edges as it is loaded
    model: str = "gcn"
    hidden: int | None = None
    layers: int | None = None
    epochs: int = 200
    lr: float | None = None
    weight_decay: float | None = None
    dropout: float | None = None
    norm: str | None = None              # GIN's MLP normalisation (None: the model's default, batch)
    reorder_nodes: str = "auto"          # relabel nodes before partitioning: auto (mgg.apps.node_order) or a mgg.data.reorder method
    seed: int = 0
    ps: int | None = None                # None: KNOB_DEFAULTS, or tuned with --tune (given: pinned)
    dist: int | None = None
    wpb: int | None = None
    backend: str = "auto"
    variant: str = "auto"                # GPU kernel variant (the CPU ignores it)
    storage_dtype: str = "fp32"          # embeddings in the store: fp32 | bf16 | fp16 (docs/storage-dtype.md)
    tf32: bool = False                   # float32 matmuls on TF32 tensor cores (torch "high" precision)
    tune: bool = False                   # runtime tuner (docs/tuner.md)
    tune_cache: str | None = None        # None: DEFAULT_TUNE_CACHE; "" or "none": no cache
    tune_log: str | None = None          # tuning log for `python -m mgg.tune --report`
    metrics_json: str | None = None
    save_weights: str | None = None      # weights file written at the end (mgg.apps.weights_file)
    log_jsonl: str | None = None         # per-epoch JSON lines (mgg.apps.run_log)
    tensorboard: str | None = None       # per-epoch TensorBoard scalars (mgg.apps.run_log)
    config_file: str | None = None       # --config: the settings file this run started from (mgg.apps.config_file)
    verbosity: int = 0                   # -q: -1, default 0, -v: 1 (mgg.apps.log_setup)
    eval_every: int = 1
    num_classes: int | None = None       # labels must be below it (None: max(y) + 1, mgg.data.labels)
    progress: bool = True
    force: bool = False                  # train even when the memory estimate says it does not fit
    profile_steps: bool = False          # time the parts of every step (mgg.apps.step_profile)
    cuda_graph: bool | None = None       # replay the step from a CUDA graph (mgg.apps.graphed); None: where it applies
    input_cache: bool = True             # the first layer's input aggregation computed once (mgg.nn.input_cache)
    row_sets: bool = True                # layers on the rows the loss/evaluation read (mgg.runtime.rowset)
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
    time_to_first_epoch_s: float | None = None    # process start to the end of the first epoch (max over ranks)
    memory: dict = field(default_factory=dict)    # per-rank host/GPU peaks (mgg.apps.memory_report)
    step_profile: dict = field(default_factory=dict)  # --profile-steps: ms per part of a step
    cuda_graph: str = ""               # --cuda-graph: "replayed", or "eager: <why>"
    row_sets: dict = field(default_factory=dict)  # row set name -> nodes over all ranks (mgg.runtime.rowset)
    kernels: dict = field(default_factory=dict)   # GPU runs: kernel modules built, loaded (mgg.apps.kernel_prebuild)
