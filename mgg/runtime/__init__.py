"""The runtime: partition -> plan -> store (the core), then executors and `DistGraph`.

The core modules (comm, partition, plan, weights, layout, store, nvshmem_store, halo, plancache,
transfer) sit below mgg.kernels; `DistGraph`, `RuntimeConfig`, `resolve_backend` and `make_store`
(mgg.runtime.graph, mgg.runtime.backends) sit above it. They are exported here lazily (PEP 562
`__getattr__`), so that importing a core module -- which runs this file first -- never loads the
kernels or the executor layer. docs/architecture.md draws the layers; tests/test_layers.py checks them.
"""
from __future__ import annotations

from typing import Any

from .comm import Communicator, RankError, abort_on_error, world
from .partition import edge_counts, owner_of, partition_ranges, range_sizes
from .plan import AggregationPlan, PlanParams, build_plan, cut_partitions, warp_worklist
from .store import LocalStore, MPIStore, SymmetricArray, SymmetricStore

__all__ = ["Communicator", "RankError", "abort_on_error", "world", "DistGraph", "RuntimeConfig",
           "resolve_backend", "partition_ranges", "owner_of", "range_sizes", "edge_counts",
           "AggregationPlan", "PlanParams", "build_plan", "cut_partitions",
           "warp_worklist", "SymmetricArray", "SymmetricStore", "LocalStore", "MPIStore", "make_store"]


def __getattr__(name: str) -> Any:
    """The executor-layer names, imported on first use."""
    if name in ("DistGraph", "RuntimeConfig"):
        from . import graph as module
    elif name in ("resolve_backend", "make_store"):
        from . import backends as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
