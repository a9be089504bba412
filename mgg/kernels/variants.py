"""The registry of GPU aggregation kernel variants: the one place a variant is named.

Each `KernelVariant` says which kernels of mgg/kernels/aggregate.cu it launches, how much dynamic
shared memory a block asks for (`smem_bytes`, the ONE formula: `GPUExecutor` passes it to the
launch and the runtime tuner's feasibility check in mgg.tuning.model calls the same
function, so the tuner never proposes what the launcher refuses), which device buffers it needs
beyond the plan's arrays, and whether the tuner compares it (`tunable`) and bench/fullgraph.py
times it (`benched`).

Adding a variant = its kernel source in aggregate.cu, its launch in `GPUExecutor.__call__`
(mgg/kernels/gpu.py) and one `_register(KernelVariant(...))` here. The CLI (`--variant`), the
tuner, `mgg.tune`, bench and the GPU tests read `variant_names()` / `tuned_variant_names()`.

Importing this module is cheap (no torch, no CUDA): the CLI reads it to build its choices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["KernelVariant", "VARIANTS", "get_variant", "variant_names", "tuned_variant_names",
           "benched_variant_names", "plan_variant_names", "lane_layout", "DEFAULT_VARIANT", "INT_BYTES", "FLOAT_BYTES",
           "MAX_DIM_PADDED", "CSR_ROWS_MAX_DIM_PADDED", "MAX_DIM_16", "MAX_VPL_16", "PLAN_MAX_VPL", "CSR_ROWS_MAX_VPL",
           "shared_memory_problem",
           "storage_dtype_problem", "check_storage_dtype", "variants_for_storage"]

INT_BYTES = 4
FLOAT_BYTES = 4
# Row widths the kernels take, the one place each limit is defined. A warp's 32 lanes each hold up
# to V 16-byte vectors of a row (lane_layout): 4 floats, or 8 elements of a 16-bit storage dtype.
#: float4 vectors per lane of the plan kernels (aggregate.cu; mgg.kernels.gpu.vectors_per_lane)
PLAN_MAX_VPL = 8
#: float4 vectors per lane of the csr_rows kernels (local_csr.cu; mgg.kernels.csr_rows)
CSR_ROWS_MAX_VPL = 4
#: widest padded float32 row of the plan kernels: 32 lanes x 8 float4 = 1024 floats
MAX_DIM_PADDED = 32 * 4 * PLAN_MAX_VPL
#: widest padded float32 row of the csr_rows kernels: 32 lanes x 4 float4 = 512 floats
CSR_ROWS_MAX_DIM_PADDED = 32 * 4 * CSR_ROWS_MAX_VPL
#: 16-byte vectors per lane of the 16-bit kernels (both families)
MAX_VPL_16 = 4
#: widest row of the 16-bit kernels: 32 lanes x 4 vectors x 8 elements = 1024
MAX_DIM_16 = 32 * MAX_VPL_16 * 8

SmemFn = Callable[[int, int, int, int], int]


@dataclass(frozen=True)
class KernelVariant:
    """One GPU aggregation kernel variant.

    Attributes:
        name: the `--variant` value.
        summary: one line, what it does.
        kernels: entry points in aggregate.cu it launches ("{v}": vectors per lane, 1/2/4/8).
        smem: (ps, dist, wpb, dim_padded) -> dynamic shared memory bytes per block; `ps` is the
            plan's largest partition size (max of ps and ps_inter), `dim_padded` the row length
            of mgg.runtime.layout.padded_dim.
        smem_only_with_remote: the shared memory is a remote-partition stage: a plan without
            remote partitions launches with none.
        buffers: device buffers beyond the plan's arrays (names, for docs and tests).
        tunable: the runtime tuner compares it under `--tune --variant auto`.
        benched: bench/fullgraph.py times it.
        local_only: it aggregates a plan without remote partitions only (a rank with no remote
            work); `auto` picks it there, and benchmarks and tests skip it elsewhere.
        executor: which launcher runs it: "plan" (GPUExecutor, the partition kernels of
            aggregate.cu), "csr" (CsrRowsExecutor, mgg/kernels/csr_rows/) or "halo_csr"
            (HaloCsrExecutor, mgg/kernels/halo_csr.py).
        storage_dtypes: the `--storage-dtype` values it has kernels for (16-bit rows read and
            upcast to float32 in registers); others are refused (`storage_dtype_problem`).
    """

    name: str
    summary: str
    kernels: tuple[str, ...]
    smem: SmemFn
    smem_only_with_remote: bool = True
    buffers: tuple[str, ...] = ()
    tunable: bool = False
    benched: bool = True
    local_only: bool = False
    executor: str = "plan"
    storage_dtypes: tuple[str, ...] = ("fp32",)

    def smem_bytes(self, ps: int, dist: int, wpb: int, dim_padded: int) -> int:
        """Dynamic shared memory per block (bytes) when the plan has remote partitions."""
        return int(self.smem(int(ps), int(dist), int(wpb), int(dim_padded)))

    def launch_smem_bytes(self, ps: int, dist: int, wpb: int, dim_padded: int, has_remote: bool) -> int:
        """What the launch asks for: `smem_bytes`, or 0 without remote partitions where the
        shared memory only stages remote rows."""
        if self.smem_only_with_remote and not has_remote:
            return 0
        return self.smem_bytes(ps, dist, wpb, dim_padded)

    def infeasible_reason(self, ps: int, dist: int, wpb: int, dim_padded: int, limits: Any) -> str:
        """Why a launch of this configuration is refused on a device with `limits` (anything with
        `smem_per_block_optin`), "" when it is not. Assumes remote partitions (the worst case)."""
        return shared_memory_problem(self.smem_bytes(ps, dist, wpb, dim_padded), limits.smem_per_block_optin)

    def feasible(self, ps: int, dist: int, wpb: int, dim_padded: int, limits: Any) -> bool:
        return not self.infeasible_reason(ps, dist, wpb, dim_padded, limits)


def lane_layout(dim_padded: int, max_vpl: int = 8, who: str = "the kernels'") -> tuple[int, int]:
    """(L lanes per row group, V float4 columns per lane) for rows of `dim_padded` floats: L is
    the smallest power of two >= Dp/4 (at most 32), V the smallest of 1, 2, 4, 8 (<= max_vpl)
    that covers the row. ValueError above 32 x 4 x max_vpl floats."""
    d4 = dim_padded // 4
    lanes = 1
    while lanes < d4 and lanes < 32:
        lanes <<= 1
    need = -(-d4 // lanes)
    for v in (1, 2, 4, 8):
        if need <= v <= max_vpl:
            return lanes, v
    raise ValueError(f"embedding width {dim_padded} is above {who} limit of {32 * 4 * max_vpl}")


def shared_memory_problem(smem: int, limit: int) -> str:
    """The launch rule both the launcher and the tuner apply: "" when `smem` bytes of dynamic
    shared memory per block fit the device's opt-in limit, else the reason."""
    if smem > limit:
        return f"SMEM {smem} B > {limit} B per block"
    return ""


def _eq1(ps: int, dist: int, wpb: int, dp: int) -> int:
    """MGG Eq. 1 at the padded width: ps neighbor ids + partial sums + one remote row per warp."""
    return ps * wpb * INT_BYTES + 2 * wpb * dp * FLOAT_BYTES


def _stage(ps: int, dist: int, wpb: int, dp: int) -> int:
    """A whole remote partition in flight per warp: ps rows of dp floats (sums in registers)."""
    return wpb * ps * dp * FLOAT_BYTES


def _none(ps: int, dist: int, wpb: int, dp: int) -> int:
    return 0


_REGISTRY: dict[str, KernelVariant] = {}


def _register(v: KernelVariant) -> None:
    if v.name in _REGISTRY or v.name == "auto":
        raise ValueError(f"kernel variant {v.name!r} is registered twice (or uses the reserved name)")
    _REGISTRY[v.name] = v


_register(KernelVariant(
    "pipelined", "§5.1 interleaved kernel: async (nbi) gets of a remote partition into shared memory "
    "overlap a local partition's aggregation; atomics combine partitions",
    ("mgg_pipelined_v{v}",), _stage, tunable=True))
_register(KernelVariant(
    "pipelined_2pass", "pipelined with partial sums per partition, then a combine kernel (no atomics)",
    ("mgg_pipelined_v{v}", "mgg_combine"), _stage, buffers=("local_partials", "remote_partials")))
_register(KernelVariant(
    "ptr", "interleaved, remote rows read in place over NVLink through nvshmem_ptr",
    ("mgg_pipelined_v{v}",), _none, tunable=True))
_register(KernelVariant(
    "halo", "each unique remote row fetched once into a private buffer, then the local kernel over "
    "the remote partitions", ("mgg_halo_gather", "mgg_local_v{v}"), _none, buffers=("halo",),
    tunable=True, storage_dtypes=("fp32", "bf16", "fp16")))
_register(KernelVariant(
    "halo_overlap", "halo with the unique-row gather on a second, high-priority stream while the local "
    "partitions aggregate on the first; the remote partitions start when the gather's event fires",
    ("mgg_halo_gather", "mgg_local_v{v}"), _none, buffers=("halo",)))
_register(KernelVariant(
    "nonpipelined", "baseline (b): local and remote partitions on different warps",
    ("mgg_split_v{v}",), _stage, smem_only_with_remote=False))
_register(KernelVariant(
    "paper", "kernel 1 (local) + kernel 2 (remote, §5.2 shared-memory layout, blocking get)",
    ("mgg_local_v{v}", "mgg_remote_get"), _eq1))
_register(KernelVariant(
    "csr_rows", "a rank without remote work: degree-aware rows of the local CSR (hubs split over warps, "
    "short rows packed), each output row written by one warp a pass; weight-free for sum/mean/gcn",
    ("mgg_csr_rows_l{l}_v{v}_w{w}", "mgg_csr_combine"), _none, local_only=True, executor="csr",
    storage_dtypes=("fp32", "bf16", "fp16")))
_register(KernelVariant(
    "halo_csr", "each unique remote row gathered once on a high-priority side stream while the degree-aware "
    "CSR kernel aggregates the local columns; then the remote columns from the gathered rows, added to "
    "each row (no atomics)", ("mgg_halo_gather_rows", "mgg_csr_rows_l{l}_v{v}_w{w}", "mgg_csr_combine"),
    _none, buffers=("halo",), tunable=True, executor="halo_csr", storage_dtypes=("fp32", "bf16", "fp16")))
_register(KernelVariant(
    "paper_nbi", "kernel 1 + kernel 2 with get_nbi + quiet",
    ("mgg_local_v{v}", "mgg_remote_get"), _eq1, benched=False))


def variant_names() -> tuple[str, ...]:
    """Every registered variant, in registration order (not "auto", which picks one of them)."""
    return tuple(_REGISTRY)


def plan_variant_names() -> tuple[str, ...]:
    """The variants GPUExecutor launches (the partition kernels of aggregate.cu)."""
    return tuple(n for n, v in _REGISTRY.items() if v.executor == "plan")


def tuned_variant_names() -> tuple[str, ...]:
    """The variants `--tune --variant auto` compares on the GPU."""
    return tuple(n for n, v in _REGISTRY.items() if v.tunable)


def benched_variant_names() -> tuple[str, ...]:
    """The variants bench/fullgraph.py times."""
    return tuple(n for n, v in _REGISTRY.items() if v.benched)


def get_variant(name: str) -> KernelVariant:
    """The registered variant `name`; ValueError naming the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown GPU kernel variant {name!r}; expected one of {variant_names()}") from None


def storage_dtype_problem(variant: str, storage_dtype: str) -> str:
    """"" when `variant` has kernels for `storage_dtype`, else the one-line reason (naming the
    variants that do). "auto" picks a capable variant for any storage dtype."""
    if variant == "auto":
        return ""
    if storage_dtype in get_variant(variant).storage_dtypes:
        return ""
    able = ", ".join(variants_for_storage(storage_dtype))
    return (f"--storage-dtype {storage_dtype} is not implemented for GPU --variant {variant} "
            f"(16-bit kernels: auto, {able})")


def check_storage_dtype(variant: str, storage_dtype: str) -> None:
    """ValueError (one line) when `variant` cannot run with `storage_dtype` (see storage_dtype_problem)."""
    problem = storage_dtype_problem(variant, storage_dtype)
    if problem:
        raise ValueError(problem)


def variants_for_storage(storage_dtype: str, names: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The variants of `names` (default: all registered) with kernels for `storage_dtype`."""
    names = variant_names() if names is None else names
    return tuple(n for n in names if storage_dtype in get_variant(n).storage_dtypes)


#: the registered names (a tuple, for `choices=` and parametrize lists)
VARIANTS = variant_names()
#: the variant of a configuration that names none (tuner configurations, old tuning logs)
DEFAULT_VARIANT = "pipelined"
assert DEFAULT_VARIANT in _REGISTRY
