"""The runtime: partition -> plan -> store/executor, behind `DistGraph`."""
from .comm import Communicator, RankError, abort_on_error, world
from .context import DistGraph, RuntimeConfig, resolve_backend
from .partition import edge_counts, owner_of, partition_ranges, range_sizes
from .plan import AggregationPlan, PlanParams, build_plan, cut_partitions, smem_bytes, warp_worklist
from .store import LocalStore, MPIStore, SymmetricArray, SymmetricStore, make_store

__all__ = ["Communicator", "RankError", "abort_on_error", "world", "DistGraph", "RuntimeConfig",
           "resolve_backend", "partition_ranges", "owner_of", "range_sizes", "edge_counts",
           "AggregationPlan", "PlanParams", "build_plan", "cut_partitions", "smem_bytes",
           "warp_worklist", "SymmetricArray", "SymmetricStore", "LocalStore", "MPIStore", "make_store"]
