"""The runtime core: comm -> partition -> plan -> store, row sets and transposes.

Nothing here imports mgg.kernels: `DistGraph`, `RuntimeConfig`, `resolve_backend` and `make_store`
live one layer up in mgg.graph. docs/architecture.md draws the layers; tests/project/test_layers.py
checks them.
"""
from __future__ import annotations

from .comm import Communicator, RankError, abort_on_error, world
from .partition import edge_counts, owner_of, partition_ranges, range_sizes
from .plan import AggregationPlan, PlanParams, build_plan, cut_partitions, warp_worklist
from .store import LocalStore, MPIStore, SymmetricArray, SymmetricStore

__all__ = ["Communicator", "RankError", "abort_on_error", "world", "partition_ranges", "owner_of",
           "range_sizes", "edge_counts", "AggregationPlan", "PlanParams", "build_plan", "cut_partitions",
           "warp_worklist", "SymmetricArray", "SymmetricStore", "LocalStore", "MPIStore"]
