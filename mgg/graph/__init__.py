"""The graph layer, the only code that holds a DistGraph: `DistGraph` and `RuntimeConfig`
(mgg.graph.dist_graph), the backend choice and symmetric-store factory (mgg.graph.backends), the
executor factory (mgg.graph.factory) and the executors that run over a DistGraph
(mgg.graph.adaptive, mgg.graph.gat_gpu), and `GcnFactors` (mgg.graph.gcn_factors: the part of
the gcn product diag(f) (A + I) diag(f) an aggregation call applies). It sits above mgg.kernels
and below mgg.tuning and mgg.nn; docs/architecture.md draws the layers, tests/project/test_layers.py
checks them.
"""
from .backends import make_store, resolve_backend
from .dist_graph import DistGraph, RuntimeConfig
from .gcn_factors import SCALED_INPUT, WHOLE, GcnFactors

__all__ = ["DistGraph", "RuntimeConfig", "resolve_backend", "make_store", "GcnFactors", "WHOLE", "SCALED_INPUT"]
