"""mgg.data: the Graph container, validation, loaders, generators and the dataset registry.

Layering: imports nothing from mgg.runtime, mgg.nn or mgg.apps.
"""
from .generators import PRESETS, papers_like, powerlaw, preset, products_like, reddit_like, sbm
from .graph import Graph, csr_from_edges
from .loaders import (atomic_write, from_pyg, from_scipy, is_ogb_folder, load_edgelist, load_karate,
                      load_npz, load_ogb, save_edgelist, save_npz, to_scipy)
from .prepare import PreparedGraph, prepare_graph
from .registry import DATASET_NAMES, DEFAULT_DATASET, load_dataset
from .validate import GraphFormatError, validate_graph

__all__ = [
    "Graph", "csr_from_edges", "GraphFormatError", "validate_graph", "load_dataset",
    "DATASET_NAMES", "DEFAULT_DATASET",
    "load_npz", "save_npz", "atomic_write", "from_scipy", "to_scipy", "from_pyg", "load_ogb",
    "is_ogb_folder", "load_edgelist", "save_edgelist", "load_karate",
    "PreparedGraph", "prepare_graph",
    "sbm", "powerlaw", "preset", "PRESETS", "reddit_like", "products_like", "papers_like",
]
