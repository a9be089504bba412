"""The registry of CUDA kernel modules: every mgg/kernels/<name>.cu, whether it links NVSHMEM, and
the run features that load it.

`load_module` (mgg.kernels.build) refuses a name that is not registered here, and a test checks
that every .cu source is registered with the right `nvshmem` flag, so this is the one list the
prebuild (mgg.kernels.prebuild, `python -m mgg.build`) reads to build a run's kernels before its
first epoch. A run's features come from its configuration (mgg.apps.kernel_features); a module
is built when any of its `features` is among them.

Features:
    halo_gather       the NVSHMEM store's gather of other GPUs' rows (P > 1) and the halo
                      gathers of the halo variants (mgg_halo_gather[_rows] of aggregate.cu)
    plan_variants     the partition kernels of GPUExecutor (mgg/kernels/gpu.py)
    csr_variants      the degree-aware CSR kernels (csr_rows, halo_csr: mgg/kernels/local_csr.py)
    attention         fused attention / mean aggregation (GAT: mgg/kernels/gat_gpu.py)
    dense             the ReLU-mask + bias-gradient pass, the bias-ReLU-dropout epilogue
    tall_rows         the GEMMs of tall float32 matrices (a rank with TALL_GEMM_ROWS rows or more)
    dropout           dropout masks from the counter hash, fused dropout + input projection
    batch_norm        fused batch norm + ReLU
    sampling          neighbour sampling and id maps of --mode sampled
    embedding         the sharded embedding bag (mgg.embedding)

A module may be built as several cubins of one source, its `parts` (local_csr: one per storage
dtype, selected by a -D macro, 26-35 entry points each), so that its parts build in parallel and
a run builds only the parts it loads. A function belongs to the part whose name it carries as a
`_<part>` suffix (mgg_csr_rows_bf16_...), else to the first part. `load_module` returns an
object whose `get_function` loads the function's part on first use. A build spec names a module
("local_csr": every part) or one part ("local_csr:fp32").

Importing this module is cheap (no torch, no CUDA).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelModule", "FEATURES", "kernel_module", "module_names", "modules_for", "uses_nvshmem", "parse_spec",
           "expand_specs"]

FEATURES = ("halo_gather", "plan_variants", "csr_variants", "attention", "dense", "tall_rows", "dropout",
            "batch_norm", "sampling", "embedding")


@dataclass(frozen=True)
class KernelModule:
    """One CUDA source, mgg/kernels/<name>.cu.

    Attributes:
        name: the source's stem (`load_module(name)`, `kernel(name, ...)`).
        nvshmem: it calls NVSHMEM device functions: built relocatable and device-linked against
            libnvshmem_device.a, registered with NVSHMEM on load; else a plain cubin.
        features: the run features (FEATURES) that load it.
        training: a training run (mgg.train) may load it; `python -m mgg.build` builds these
            by default and every module with --all.
        parts: names of the cubins it is built as (empty: one cubin of the whole source); the
            part names of a storage-split module are storage dtypes (fp32, bf16, fp16).
        part_macro: the macro that selects part i (-D<part_macro>=i; plain modules only).
    """

    name: str
    nvshmem: bool
    features: tuple[str, ...]
    training: bool = True
    parts: tuple[str, ...] = ()
    part_macro: str = ""

    def __post_init__(self):
        unknown = set(self.features) - set(FEATURES)
        if unknown or not self.features:
            raise ValueError(f"kernel module {self.name!r}: features must be among {FEATURES}, got {self.features}")
        if bool(self.parts) != bool(self.part_macro) or (self.parts and self.nvshmem):
            raise ValueError(f"kernel module {self.name!r}: parts need a part_macro, and a plain (non-NVSHMEM) build")

    def part_of(self, function: str) -> str:
        """The part holding entry point `function`: the part named by its `_<part>` suffix, else the first."""
        if not self.parts:
            raise ValueError(f"kernel module {self.name!r} is built whole (it has no parts)")
        for part in self.parts[1:]:
            if f"_{part}_" in function or function.endswith(f"_{part}"):
                return part
        return self.parts[0]

    def part_defines(self, part: str) -> tuple[str, ...]:
        """The -D macros of `part` (ValueError naming the parts for another name)."""
        if part not in self.parts:
            raise ValueError(f"kernel module {self.name!r} has no part {part!r} (parts: {', '.join(self.parts) or 'none'})")
        return (f"{self.part_macro}={self.parts.index(part)}",)

    def parts_for_storage(self, storage_dtype: str) -> tuple[str | None, ...]:
        """The parts a run with `storage_dtype` embeddings loads: float32's (gradients and
        float32 tables) and the storage dtype's; (None,) for a module built whole."""
        if not self.parts:
            return (None,)
        return tuple(p for p in self.parts if p in ("fp32", storage_dtype))


_REGISTRY: dict[str, KernelModule] = {}


def _register(m: KernelModule) -> None:
    if m.name in _REGISTRY:
        raise ValueError(f"kernel module {m.name!r} is registered twice")
    _REGISTRY[m.name] = m


_register(KernelModule("aggregate", True, ("halo_gather", "plan_variants")))
_register(KernelModule("local_csr", False, ("csr_variants",), parts=("fp32", "bf16", "fp16"),
                       part_macro="MGG_CSR_STORAGE"))
_register(KernelModule("gat_fused", True, ("attention",)))
_register(KernelModule("tall_gemm", False, ("tall_rows",)))
_register(KernelModule("relu_grad", False, ("dense",)))
_register(KernelModule("bias_relu_dropout", False, ("dense",)))
_register(KernelModule("dropout", False, ("dropout",)))
_register(KernelModule("dropout_project", False, ("dropout",)))
_register(KernelModule("norm_relu", False, ("batch_norm",)))
_register(KernelModule("sample", False, ("sampling",)))
_register(KernelModule("embedding_bag", True, ("embedding",), training=False))


def module_names(training_only: bool = False) -> tuple[str, ...]:
    """Every registered module (only those a training run may load with `training_only`)."""
    return tuple(n for n, m in _REGISTRY.items() if m.training or not training_only)


def kernel_module(name: str) -> KernelModule:
    """The registered module `name`; ValueError naming the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown CUDA kernel module {name!r}: register mgg/kernels/{name}.cu in "
                         f"mgg.kernels.modules (registered: {', '.join(_REGISTRY)})") from None


def uses_nvshmem(name: str) -> bool:
    """Whether module `name` links NVSHMEM (its registered flag)."""
    return kernel_module(name).nvshmem


def modules_for(features) -> tuple[str, ...]:
    """The modules any of `features` loads, in registration order; ValueError on an unknown feature."""
    features = set(features)
    unknown = features - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown kernel features {sorted(unknown)}; expected among {FEATURES}")
    return tuple(n for n, m in _REGISTRY.items() if features & set(m.features))


def parse_spec(spec: str) -> tuple[str, str | None]:
    """("local_csr", "fp32") for "local_csr:fp32", ("aggregate", None) for "aggregate"; ValueError
    for an unknown module or part."""
    name, _, part = spec.partition(":")
    m = kernel_module(name)
    if part:
        m.part_defines(part)
        return name, part
    return name, None


def expand_specs(specs) -> list[tuple[str, str | None]]:
    """(module, part) pairs to build for `specs`: a module with parts named bare stands for all of them."""
    out: list[tuple[str, str | None]] = []
    for spec in specs:
        name, part = parse_spec(spec)
        parts = (part,) if part else (kernel_module(name).parts or (None,))
        out.extend((name, p) for p in parts if (name, p) not in out)
    return out
