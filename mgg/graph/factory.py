"""The one executor factory: which executor runs a plan, or a fused aggregation, on a backend.

`DistGraph.executor` (the plan path: out = W x + diag * x) and `FusedAggregation` (the fused
GAT / mean path, mgg.graph.adaptive) both ask here, so a backend's executors are chosen in
one place. GPU modules are imported only when the GPU backend is asked for.
"""
from __future__ import annotations

from typing import Any

from ..runtime.plan import AggregationPlan

__all__ = ["plan_executor", "fused_executor"]


def plan_executor(backend: str, plan: AggregationPlan, store: Any, variant: str = "auto",
                  kind: str | None = None, storage_dtype: str = "fp32"):
    """The executor of `plan` on `backend` ("gpu": the launcher of kernel `variant` -- "auto"
    resolved by `choose_variant` -- uploading the plan; "cpu": CPUExecutor, which ignores the
    variant). `kind` (the plan's aggregation kind) lets csr_rows skip the per-edge weights.
    `storage_dtype` ("fp32" | "bf16" | "fp16"): the element type of the symmetric array the
    executor will be called with; on the GPU a variant without 16-bit kernels refuses it
    (ValueError, one line, naming the variants that have them). Call it as `ex(x, sym)`."""
    if backend == "gpu":
        from ..kernels.gpu import GPUExecutor, choose_variant
        from ..kernels.variants import check_storage_dtype, get_variant

        from ..runtime.store import storage_torch_dtype

        if variant == "auto":
            variant = choose_variant(plan, storage_dtype)
        check_storage_dtype(variant, storage_dtype)
        st = storage_torch_dtype(storage_dtype)
        if get_variant(variant).executor == "csr":
            from ..kernels.csr_rows import CsrRowsExecutor

            return CsrRowsExecutor(plan, store, kind, storage_dtype=st)
        if get_variant(variant).executor == "halo_csr":
            from ..kernels.halo_csr import HaloCsrExecutor

            return HaloCsrExecutor(plan, store, kind, storage_dtype=st)
        return GPUExecutor(plan, store, variant=variant, storage_dtype=st)
    from ..kernels.cpu import CPUExecutor

    return CPUExecutor(plan)


def fused_executor(backend: str, dg: Any, plan: AggregationPlan, mode: str, add_self_loops: bool,
                   strategy: str, negative_slope: float, chunk_edges: int | None = None):
    """The fused attention / mean executor of `plan` on `backend` ("gpu": GATGPUExecutor, which
    runs its own halo exchanges over `dg`; "cpu": FusedCPUExecutor over a gathered table)."""
    if backend == "gpu":
        from .gat_gpu import GATGPUExecutor

        return GATGPUExecutor(dg, plan, mode, add_self_loops, strategy, negative_slope)
    from ..kernels.gat_cpu import DEFAULT_CHUNK_EDGES, FusedCPUExecutor

    return FusedCPUExecutor(plan, mode, add_self_loops, strategy, negative_slope,
                            chunk_edges or DEFAULT_CHUNK_EDGES)
