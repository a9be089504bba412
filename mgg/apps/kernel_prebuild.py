"""The CUDA kernels a training run loads, built in the background before its first epoch.

`kernel_features(cfg, world_size, max_rows)` names the run's features (mgg.kernels.modules.FEATURES)
from its configuration and the most rows a rank holds (or a lower bound of it); the module
registry maps them to kernel modules. On GPU runs `start_kernel_prebuild` (before the dataset
loads) builds the modules of the configuration missing from the per-user cache in parallel while
the run loads its graph (with the tall-matrix GEMMs when a generated preset is tall enough);
`extend_kernel_prebuild` (after the load) adds those that depend on the graph's size (the
tall-matrix GEMMs, which only a rank of TALL_GEMM_ROWS rows or more runs);
`finish_kernel_prebuild` (the `build` phase) waits for both, so no kernel compiles inside the
first epoch. Rank 0 prints the progress lines.

A module the features miss still works: it builds on first use (mgg.kernels.build.load_module).
The GPU tests check that a run loads no module outside its prediction.
"""
from __future__ import annotations

import inspect
import os
import sys

from .config import TrainConfig, UserError, tune_variants

__all__ = ["kernel_features", "run_kernel_modules", "aggregation_variants", "max_rank_rows", "size_specs",
           "start_kernel_prebuild", "extend_kernel_prebuild", "finish_kernel_prebuild", "kernel_summary"]

#: the executor of a variant (mgg.kernels.variants) -> the features whose modules it loads
_EXECUTOR_FEATURES = {"plan": ("plan_variants", "halo_gather"), "csr": ("csr_variants",),
                      "halo_csr": ("csr_variants", "halo_gather")}

_ACTIVE: dict[int, list] = {}  # id of the communicator -> its running KernelPrebuilds (or the error starting one)
_DONE: dict[int, list] = {}    # id of the communicator -> the PrebuildResults of its last run


def aggregation_variants(cfg: TrainConfig, world_size: int) -> tuple[str, ...]:
    """The GPU aggregation variants a full-graph run of `cfg` may launch: those `--tune` compares,
    the one `--variant` names, or what "auto" can pick (mgg.kernels.gpu.choose_variant: csr_rows
    on a rank without remote work -- every rank at P = 1 --, else halo_csr, or ptr for float32)."""
    if cfg.tune:
        return tune_variants(cfg, "gpu")
    if cfg.variant != "auto":
        return (cfg.variant,)
    if world_size == 1:
        return ("csr_rows",)
    return ("csr_rows", "halo_csr") + (("ptr",) if cfg.storage_dtype == "fp32" else ())


def _norm(cfg: TrainConfig, model_cls: type) -> str | None:
    """The normalisation the model is built with: --norm, else its constructor's default (None
    for a model without one)."""
    if cfg.norm is not None:
        return cfg.norm
    param = inspect.signature(model_cls).parameters.get("norm")
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def kernel_features(cfg: TrainConfig, world_size: int, max_rows: int | None = None) -> tuple[str, ...]:
    """The kernel features (mgg.kernels.modules.FEATURES) of a GPU training run of `cfg` on
    `world_size` ranks, sorted. `max_rows`: the most rows a rank holds, or a lower bound of it
    (None: not known yet, and no feature that depends on it); "tall_rows" from mgg.nn.dense.TALL_GEMM_ROWS rows, and in
    sampled mode, whose batches' input layers can be that tall."""
    from ..kernels.variants import get_variant
    from ..nn.dense import TALL_GEMM_ROWS
    from ..nn.registry import model_entry

    cfg = cfg.resolved()
    entry = model_entry(cfg.model)
    features = {"dense"}
    if world_size > 1:
        features.add("halo_gather")  # the NVSHMEM store reads other GPUs' rows
    if cfg.mode == "sampled":
        # the batches' feature rows come through the store's gather kernel at every P
        features.update(("sampling", "tall_rows", "halo_gather"))
        model_cls = entry.sampled_model
    else:
        model_cls = entry.model
    # full-graph training, and sampled mode's evaluation (its full-graph twin over the DistGraph)
    if entry.aggregation is None:
        features.add("attention")
    else:
        for v in aggregation_variants(cfg, world_size):
            features.update(_EXECUTOR_FEATURES[get_variant(v).executor])
    if max_rows is not None and max_rows >= TALL_GEMM_ROWS:
        features.add("tall_rows")
    if cfg.dropout and cfg.dropout > 0:
        features.add("dropout")
    if _norm(cfg, model_cls) == "batch":
        features.add("batch_norm")
    return tuple(sorted(features))


def run_kernel_modules(cfg: TrainConfig, world_size: int, max_rows: int | None = None) -> tuple[str, ...]:
    """The kernel build specs (mgg.kernels.modules) a GPU training run of `cfg` on `world_size`
    ranks loads (`max_rows`: as kernel_features): each module of its features, only the parts of
    its storage dtype (and float32's) of a module built in parts ("local_csr:fp32")."""
    from ..kernels.modules import kernel_module, modules_for

    specs = []
    for name in modules_for(kernel_features(cfg, world_size, max_rows)):
        for part in kernel_module(name).parts_for_storage(cfg.storage_dtype):
            specs.append(name if part is None else f"{name}:{part}")
    return tuple(specs)


def max_rank_rows(indptr, world_size: int) -> int:
    """The most rows a rank holds: the ranges DistGraph cuts (mgg.runtime.partition_ranges with its
    default node cost; the same call), from the CSR row pointer `indptr` int64 [N + 1]."""
    import numpy as np

    from ..runtime.partition import partition_ranges

    return int(np.diff(partition_ranges(np.asarray(indptr, dtype=np.int64), world_size)).max(initial=0))


def _start(cfg: TrainConfig, comm, specs) -> None:
    """A KernelPrebuild of `specs` for this rank's GPU (its error, when it cannot start, is kept
    for finish_kernel_prebuild, which reports it on every rank)."""
    import torch

    from ..kernels.build import cuda_arch
    from ..kernels.prebuild import KernelPrebuild
    from ..runtime.gpu_assignment import device_index

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    waves = _ACTIVE.setdefault(id(comm), [])
    try:
        arch = os.environ.get("MGG_CUDA_ARCH") or cuda_arch(device_index(comm.local_rank, torch.cuda.device_count()))
        waves.append(KernelPrebuild(specs, [arch], progress=say if comm.rank == 0 and cfg.progress else None).start())
    except Exception as e:  # noqa: BLE001 - e.g. no NVSHMEM wheel: reported by finish_kernel_prebuild, on every rank
        waves.append(e)


def start_kernel_prebuild(cfg: TrainConfig, comm) -> None:
    """On a GPU run, start building the missing kernels its configuration loads, in the background
    (every rank; ranks of one node share the cache and build each module once), for the
    architecture of this rank's GPU. Progress lines on rank 0 when `cfg.progress`. Nothing on
    the CPU backend."""
    from ..graph.backends import resolve_backend

    _ACTIVE.pop(id(comm), None)
    if resolve_backend(cfg.backend) == "gpu":
        _start(cfg, comm, run_kernel_modules(cfg, comm.size, preset_rows_per_rank(cfg, comm.size)))


def preset_rows_per_rank(cfg: TrainConfig, world_size: int) -> int | None:
    """N / P of a generated preset (its size is known before it is drawn): the most rows a rank
    holds is at least that, so a preset that tall builds its tall-matrix kernels from the start.
    None for a file or a small built-in graph (the load tells)."""
    from ..data.generators import PRESETS, preset_sizes

    if cfg.dataset not in PRESETS:
        return None
    try:
        return -(-preset_sizes(cfg.dataset, cfg.scale)[0] // world_size)
    except ValueError:  # a bad --scale: the load says so
        return None


def extend_kernel_prebuild(cfg: TrainConfig, comm, graph) -> None:
    """After the load: start building the kernels that the graph's size adds (the tall-matrix
    GEMMs of a rank with TALL_GEMM_ROWS rows or more). Only after start_kernel_prebuild."""
    waves = _ACTIVE.get(id(comm))
    if not waves:
        return
    known = {spec for w in waves if not isinstance(w, Exception) for spec in w.names}
    more = size_specs(cfg, comm.size, graph.indptr, known)
    if more:
        _start(cfg, comm, more)


def size_specs(cfg: TrainConfig, world_size: int, indptr, known) -> list[str]:
    """The build specs a run of `cfg` on the graph of row pointer `indptr` loads beyond `known`
    (those its configuration alone named): the graph's size decides them."""
    return [s for s in run_kernel_modules(cfg, world_size, max_rank_rows(indptr, world_size)) if s not in known]


def finish_kernel_prebuild(comm, device=None) -> None:
    """Wait for the kernels `start_kernel_prebuild` and `extend_kernel_prebuild` started (nothing
    when none were); the `build` phase calls it before the executors load their modules. With a
    CUDA `device` (this rank's), the prebuilt modules are then loaded onto it, so the first epoch
    loads none. Collective: a module that failed to build or load on any rank raises the same
    UserError on every rank."""
    err = None
    done = []
    for wave in _ACTIVE.pop(id(comm), []):
        if isinstance(wave, Exception):
            err = err or wave
            continue
        try:
            done.append(wave.wait())
        except Exception as e:  # noqa: BLE001 - agreed on below
            err = err or e
    _DONE[id(comm)] = done
    if err is None and device is not None and getattr(device, "type", None) == "cuda":
        try:
            _load(done, device.index)
        except Exception as e:  # noqa: BLE001 - agreed on below
            err = e
    try:
        comm.check(err)
    except Exception as e:  # noqa: BLE001 - the same one line on every rank
        raise UserError(str(e)) from e


def _load(results, device: int) -> None:
    """Load every module (part) the prebuilds built or found onto GPU `device`."""
    from ..kernels.build import load_module
    from ..kernels.modules import expand_specs

    for res in results:
        for name, part in expand_specs(res.names):
            mod = load_module(name, device=device)
            if part is not None:
                mod.part(part)


def kernel_summary(cfg: TrainConfig, comm) -> dict:
    """The metrics JSON's `kernels` of a GPU run (empty on the CPU backend): the architecture, the
    modules prebuilt, the seconds this process spent compiling (per module and wall, of each
    wave), and the modules any rank loaded -- a module loaded but not prebuilt compiled on first
    use. Collective."""
    from ..kernels.build import loaded_modules
    from ..graph.backends import resolve_backend

    if resolve_backend(cfg.backend) != "gpu":
        return {}
    results = _DONE.pop(id(comm), [])
    loaded = sorted({n for names in comm.allgather(loaded_modules()) for n in names})
    if not results:
        return {"loaded": loaded}
    return {"arch": ",".join(results[0].archs), "prebuilt": [n for r in results for n in r.names], "loaded": loaded,
            "compiled_s": {k.split("@")[0]: round(v, 2) for r in results for k, v in sorted(r.built.items())},
            "prebuild_wall_s": [round(r.seconds, 2) for r in results]}
