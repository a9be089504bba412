"""Test oracles shipped with mgg: independent float64 references that tests and benchmarks compare
against, and test fixtures (mgg.testing.terminal: a command run under a pseudo-terminal, to type
Ctrl-C into it). Nothing on the training path imports this package."""
from mgg.testing.reference import KINDS, aggregate_reference, aggregation_matrix, edge_weights, self_weights

__all__ = ["aggregation_matrix", "aggregate_reference", "edge_weights", "self_weights", "KINDS"]
