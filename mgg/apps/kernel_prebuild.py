"""The CUDA kernels a training run loads, built in the background before its first epoch.

`kernel_features(cfg, world_size)` names the run's features (mgg.kernels.modules.FEATURES) from
its configuration; the module registry maps them to kernel modules. `start_kernel_prebuild` (GPU
runs, before the dataset loads) builds the modules missing from the per-user cache in parallel
while the run loads and partitions its graph; `finish_kernel_prebuild` (the `build` phase) waits
for them, so no kernel compiles inside the first epoch. Rank 0 prints the progress lines.

A module the features miss still works: it builds on first use (mgg.kernels.build.load_module).
The GPU tests check that a run loads no module outside its prediction.
"""
from __future__ import annotations

import inspect
import sys

from .config import TUNED_VARIANTS, TrainConfig, UserError

__all__ = ["kernel_features", "run_kernel_modules", "aggregation_variants", "start_kernel_prebuild",
           "finish_kernel_prebuild", "kernel_summary"]

#: the executor of a variant (mgg.kernels.variants) -> the features whose modules it loads
_EXECUTOR_FEATURES = {"plan": ("plan_variants", "halo_gather"), "csr": ("csr_variants",),
                      "halo_csr": ("csr_variants", "halo_gather")}

_ACTIVE: dict[int, object] = {}  # id of the communicator -> its running KernelPrebuild
_DONE: dict[int, object] = {}    # id of the communicator -> the PrebuildResult of its last run


def aggregation_variants(cfg: TrainConfig, world_size: int) -> tuple[str, ...]:
    """The GPU aggregation variants a full-graph run of `cfg` may launch: those `--tune` compares,
    the one `--variant` names, or what "auto" can pick (mgg.kernels.gpu.choose_variant: csr_rows
    on a rank without remote work -- every rank at P = 1 --, else halo_csr, or ptr for float32)."""
    from ..kernels.variants import variants_for_storage

    if cfg.tune:
        variants = TUNED_VARIANTS if cfg.variant == "auto" else (cfg.variant,)
        if cfg.storage_dtype != "fp32":
            variants = variants_for_storage(cfg.storage_dtype, variants) or variants
        return tuple(variants)
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


def kernel_features(cfg: TrainConfig, world_size: int) -> tuple[str, ...]:
    """The kernel features (mgg.kernels.modules.FEATURES) of a GPU training run of `cfg` on
    `world_size` ranks, sorted."""
    from ..kernels.variants import get_variant
    from ..nn.registry import model_entry

    cfg = cfg.resolved()
    entry = model_entry(cfg.model)
    features = {"dense"}
    if world_size > 1:
        features.add("halo_gather")  # the NVSHMEM store reads other GPUs' rows
    if cfg.mode == "sampled":
        features.add("sampling")
        model_cls = entry.sampled_model
    else:
        model_cls = entry.model
        if entry.aggregation is None:
            features.add("attention")
        else:
            for v in aggregation_variants(cfg, world_size):
                features.update(_EXECUTOR_FEATURES[get_variant(v).executor])
    if cfg.dropout and cfg.dropout > 0:
        features.add("dropout")
    if _norm(cfg, model_cls) == "batch":
        features.add("batch_norm")
    return tuple(sorted(features))


def run_kernel_modules(cfg: TrainConfig, world_size: int) -> tuple[str, ...]:
    """The kernel build specs (mgg.kernels.modules) a GPU training run of `cfg` on `world_size`
    ranks loads: each module of its features, only the parts of its storage dtype (and
    float32's) of a module built in parts ("local_csr:fp32")."""
    from ..kernels.modules import kernel_module, modules_for

    specs = []
    for name in modules_for(kernel_features(cfg, world_size)):
        for part in kernel_module(name).parts_for_storage(cfg.storage_dtype):
            specs.append(name if part is None else f"{name}:{part}")
    return tuple(specs)


def start_kernel_prebuild(cfg: TrainConfig, comm) -> None:
    """On a GPU run, start building the run's missing kernels in the background (every rank;
    ranks of one node share the cache and build each module once) for the architecture of this
    rank's GPU. Progress lines on rank 0 when `cfg.progress`. Nothing on the CPU backend."""
    from ..runtime.backends import resolve_backend

    if resolve_backend(cfg.backend) != "gpu":
        return
    import torch

    from ..kernels.build import cuda_arch
    from ..kernels.prebuild import KernelPrebuild
    from ..runtime.gpu_assignment import device_index

    show = comm.rank == 0 and cfg.progress

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    try:
        arch = cuda_arch(device_index(comm.local_rank, torch.cuda.device_count()))
        _ACTIVE[id(comm)] = KernelPrebuild(run_kernel_modules(cfg, comm.size), [arch],
                                           progress=say if show else None).start()
    except Exception as e:  # noqa: BLE001 - e.g. no NVSHMEM wheel: reported by finish_kernel_prebuild, on every rank
        _ACTIVE[id(comm)] = e


def finish_kernel_prebuild(comm) -> None:
    """Wait for the kernels `start_kernel_prebuild` started (nothing when none were); the
    `build` phase calls it before the executors load their modules. Collective:
    a module that failed to build on any rank raises the same UserError on every rank."""
    pre = _ACTIVE.pop(id(comm), None)
    err = pre if isinstance(pre, Exception) else None
    if pre is not None and err is None:
        try:
            _DONE[id(comm)] = pre.wait()
        except Exception as e:  # noqa: BLE001 - agreed on below
            err = e
    try:
        comm.check(err)
    except Exception as e:  # noqa: BLE001 - the same one line on every rank
        raise UserError(str(e)) from e


def kernel_summary(cfg: TrainConfig, comm) -> dict:
    """The metrics JSON's `kernels` of a GPU run (empty on the CPU backend): the architecture, the
    modules prebuilt, the seconds this run spent compiling (per module and wall), and the modules
    any rank loaded -- a module loaded but not prebuilt compiled on first use. Collective."""
    from ..kernels.build import loaded_modules
    from ..runtime.backends import resolve_backend

    if resolve_backend(cfg.backend) != "gpu":
        return {}
    res = _DONE.pop(id(comm), None)
    loaded = sorted({n for names in comm.allgather(loaded_modules()) for n in names})
    if res is None:
        return {"loaded": loaded}
    return {"arch": ",".join(res.archs), "prebuilt": list(res.names), "loaded": loaded,
            "compiled_s": {k.split("@")[0]: round(v, 2) for k, v in sorted(res.built.items())},
            "prebuild_wall_s": round(res.seconds, 2)}
