"""The graph layer: `DistGraph` and `RuntimeConfig` (mgg.graph.dist_graph), and the backend choice and
symmetric-store factory (mgg.graph.backends). It sits above mgg.kernels (the executors a DistGraph
runs) and below mgg.tuning and mgg.nn. docs/architecture.md draws the layers; tests/test_layers.py
checks them.
"""
from .backends import make_store, resolve_backend
from .dist_graph import DistGraph, RuntimeConfig

__all__ = ["DistGraph", "RuntimeConfig", "resolve_backend", "make_store"]
