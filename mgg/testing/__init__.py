"""Test oracles and helpers shipped with mgg: independent float64 references that tests and
benchmarks compare against (reference, gat_reference, plan_reference, serve), and what several
test files share -- test graphs (graphs, dist_graphs, communities), launching mgg as a process
(paths, processes), comparisons (tensors), stand-ins (batch_norm, dense_gin, tuning), a command
under a pseudo-terminal (terminal) and the suite's failure log (failure_log). Test modules import
these; they never import each other. Nothing on the training path imports this package, and
importing it loads numpy and scipy only (each module imports what it needs)."""
from mgg.testing.reference import KINDS, aggregate_reference, aggregation_matrix, edge_weights, self_weights

__all__ = ["aggregation_matrix", "aggregate_reference", "edge_weights", "self_weights", "KINDS"]
