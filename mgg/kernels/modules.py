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
    attention         fused attention / mean aggregation (GAT: mgg/graph/gat_gpu.py)
    dense             the ReLU-mask + bias-gradient pass, the bias-ReLU-dropout epilogue
    tall_rows         the GEMMs of tall float32 matrices (a rank with TALL_GEMM_ROWS rows or more)
    dropout           dropout masks from the counter hash, fused dropout + input projection
    batch_norm        fused batch norm + ReLU
    sampling          neighbour sampling, id maps and the block sums of --mode sampled
    embedding         the sharded embedding bag (mgg.embedding)

A module may be built as several cubins of one source, its `parts` (local_csr: storage dtype x
weight mode x the 32-lane row kernels apart, selected by -D macros, 3-10 of its 99 entry points
each; tall_gemm: eight, 3-12 of its 76), so that its parts build in parallel, the longest compile
of a run stays short, and a run builds only the parts of its dtypes. The module's `part_rule` maps an entry
point's name to its part; `load_module` returns an object whose `get_function` loads the
function's part on first use. A build spec names a module ("local_csr": every part) or one part
("local_csr:fp32.w1").

Importing this module is cheap (no torch, no CUDA).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

__all__ = ["KernelModule", "FEATURES", "kernel_module", "module_names", "modules_for", "uses_nvshmem", "parse_spec",
           "expand_specs"]

FEATURES = ("halo_gather", "plan_variants", "csr_variants", "attention", "dense", "tall_rows", "dropout",
            "batch_norm", "sampling", "embedding")


@dataclass(frozen=True)
class KernelPart:
    """One cubin of a module built in parts: the -D macros that select its entry points, the
    storage dtype of the runs that load it, and its compile seconds (`build_s`, as KernelModule's)."""

    name: str
    defines: tuple[str, ...]
    storage: str = "fp32"
    build_s: float = 1.0


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
        parts: the cubins it is built as (empty: one cubin of the whole source; plain modules only).
        part_rule: entry point name -> the name of the part that holds it.
        build_s: CPU seconds of its compile (sm_90, nvcc 13.0, one job alone on the 2-core CI
            box): the prebuild starts the longest first, so that the slowest job does not start
            last (a module built in parts: each part's own).
    """

    name: str
    nvshmem: bool
    features: tuple[str, ...]
    training: bool = True
    parts: tuple[KernelPart, ...] = ()
    part_rule: Callable[[str], str] | None = None
    build_s: float = 1.0

    def __post_init__(self):
        unknown = set(self.features) - set(FEATURES)
        if unknown or not self.features:
            raise ValueError(f"kernel module {self.name!r}: features must be among {FEATURES}, got {self.features}")
        if bool(self.parts) != (self.part_rule is not None) or (self.parts and self.nvshmem):
            raise ValueError(f"kernel module {self.name!r}: parts need a part_rule, and a plain (non-NVSHMEM) build")

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    def part_of(self, function: str) -> str:
        """The name of the part holding entry point `function`."""
        if not self.parts:
            raise ValueError(f"kernel module {self.name!r} is built whole (it has no parts)")
        return self.part_rule(function)

    def part(self, name: str) -> KernelPart:
        """The part `name` (ValueError naming the parts for another name)."""
        for p in self.parts:
            if p.name == name:
                return p
        raise ValueError(f"kernel module {self.name!r} has no part {name!r} "
                         f"(parts: {', '.join(self.part_names) or 'none'})")

    def build_seconds(self, part: str | None = None) -> float:
        """The compile seconds of part `part` (None: of the module built whole)."""
        return self.build_s if part is None else self.part(part).build_s

    def part_defines(self, name: str) -> tuple[str, ...]:
        """The -D macros of part `name`."""
        return self.part(name).defines

    def parts_for_storage(self, storage_dtype: str) -> tuple[str | None, ...]:
        """The parts a run with `storage_dtype` embeddings loads: float32's (gradients and
        float32 tables) and the storage dtype's; (None,) for a module built whole."""
        if not self.parts:
            return (None,)
        return tuple(p.name for p in self.parts if p.storage in ("fp32", storage_dtype))


def _local_csr_part(function: str) -> str:
    """local_csr.cu's part of an entry point: its storage dtype from a _bf16 / _fp16 in the name
    (float32 without), its weight mode from a _w1 / _w2 ending (_w0 and no mode: the dtype's first
    part), and ".l32" for a row kernel of 32 lanes (mgg_csr_rows*_l32_v*): "fp32", "bf16.w1",
    "fp32.w2.l32", ..."""
    dtype = next((d for d in ("bf16", "fp16") if f"_{d}" in function), "fp32")
    m = re.search(r"_w([12])$", function)
    name = f"{dtype}.w{m.group(1)}" if m else dtype
    return f"{name}.l32" if re.match(r"mgg_csr_rows\w*_l32_v\d+_w\d$", function) else name


def _tall_gemm_part(function: str) -> str:
    """tall_gemm.cu's part of an entry point: "tn" for the weight-gradient kernels (mgg_tall_gemm_tn*),
    else "k<KC>" of the xb kernel's K chunks (mgg_tall_gemm_xb*_k<KC>_n<NT8>), "k<KC>p2" for its
    two-pass form (..._p2), and "k4n8" for the one-pass kernels of KC = 4, NT8 = 8."""
    if function.startswith("mgg_tall_gemm_tn"):
        return "tn"
    m = re.search(r"_k(\d+)_n(\d+)(_p2)?$", function)
    if m is None:
        raise ValueError(f"{function!r} is not an entry point of tall_gemm.cu")
    if m.group(3):
        return f"k{m.group(1)}p2"
    return "k4n8" if (m.group(1), m.group(2)) == ("4", "8") else f"k{m.group(1)}"


#: tall_gemm.cu in eight parts: the xb kernels by K chunks and passes (KC = 4's NT8 = 8 apart), the tn
#: kernels (MGG_TALL_GEMM_PART)
_TALL_GEMM_PARTS = tuple(KernelPart(name, (f"MGG_TALL_GEMM_PART={i}",), build_s=secs) for i, (name, secs) in
                         enumerate((("k1", 2.5), ("k2", 3.2), ("k3", 4.0), ("k4", 3.2), ("tn", 1.5), ("k3p2", 3.1),
                                    ("k4p2", 3.9), ("k4n8", 2.0)), start=1))

#: local_csr.cu in eighteen parts: storage dtype x weight mode (MGG_CSR_STORAGE, MGG_CSR_W) x
#: the row kernels of 32 lanes apart from the other entry points (MGG_CSR_L32=1 / 0), which
#: halves the longest compile of a run
_LOCAL_CSR_PARTS = tuple(KernelPart((dtype if w == 0 else f"{dtype}.w{w}") + (".l32" if l32 else ""),
                                    (f"MGG_CSR_STORAGE={s}", f"MGG_CSR_W={w}", f"MGG_CSR_L32={l32}"), dtype,
                                    build_s=3.4 if l32 else 2.9)
                         for s, dtype in enumerate(("fp32", "bf16", "fp16")) for w in range(3) for l32 in (0, 1))


_REGISTRY: dict[str, KernelModule] = {}


def _register(m: KernelModule) -> None:
    if m.name in _REGISTRY:
        raise ValueError(f"kernel module {m.name!r} is registered twice")
    _REGISTRY[m.name] = m


_register(KernelModule("aggregate", True, ("halo_gather", "plan_variants"), build_s=4.1))
_register(KernelModule("local_csr", False, ("csr_variants",), parts=_LOCAL_CSR_PARTS, part_rule=_local_csr_part))
_register(KernelModule("gat_fused", True, ("attention",), build_s=4.3))
_register(KernelModule("tall_gemm", False, ("tall_rows",), parts=_TALL_GEMM_PARTS, part_rule=_tall_gemm_part))
_register(KernelModule("relu_grad", False, ("dense",), build_s=0.3))
_register(KernelModule("bias_relu_dropout", False, ("dense",), build_s=0.3))
_register(KernelModule("dropout", False, ("dropout",), build_s=0.3))
_register(KernelModule("dropout_project", False, ("dropout",), build_s=1.8))
_register(KernelModule("norm_relu", False, ("batch_norm",), build_s=0.4))
_register(KernelModule("sample", False, ("sampling",), build_s=0.4))
_register(KernelModule("block_sum", False, ("sampling",), build_s=0.6))
_register(KernelModule("embedding_bag", True, ("embedding",), training=False, build_s=1.2))


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
        parts = (part,) if part else (kernel_module(name).part_names or (None,))
        out.extend((name, p) for p in parts if (name, p) not in out)
    return out
