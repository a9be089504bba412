"""mgg.data: the Graph container, validation, loaders, generators and the dataset registry.

The names below are exported lazily (PEP 562 `__getattr__`): importing one submodule (say
mgg.data.prepare, which the training command line needs to start) runs this file first, and must
not import every loader and generator with it (the generators import torch, scipy loads in
0.6 s and more). `from mgg.data import load_dataset` works as before.

Layering: imports nothing from mgg.runtime, mgg.nn or mgg.apps.
"""
from __future__ import annotations

import importlib
from typing import Any

#: exported name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(("PRESETS", "papers_like", "powerlaw", "preset", "products_like", "reddit_like", "sbm"),
                    "generators"),
    **dict.fromkeys(("Graph", "csr_from_edges"), "graph"),
    **dict.fromkeys(("atomic_write", "from_pyg", "from_scipy", "is_ogb_folder", "load_edgelist", "load_karate",
                     "load_npz", "load_ogb", "save_edgelist", "save_npz", "to_scipy"), "loaders"),
    **dict.fromkeys(("PreparedGraph", "prepare_graph"), "prepare"),
    **dict.fromkeys(("DATASET_NAMES", "DEFAULT_DATASET", "load_dataset"), "registry"),
    **dict.fromkeys(("GraphFormatError", "validate_graph"), "validate"),
}

__all__ = [
    "Graph", "csr_from_edges", "GraphFormatError", "validate_graph", "load_dataset",
    "DATASET_NAMES", "DEFAULT_DATASET",
    "load_npz", "save_npz", "atomic_write", "from_scipy", "to_scipy", "from_pyg", "load_ogb",
    "is_ogb_folder", "load_edgelist", "save_edgelist", "load_karate",
    "PreparedGraph", "prepare_graph",
    "sbm", "powerlaw", "preset", "PRESETS", "reddit_like", "products_like", "papers_like",
]


def __getattr__(name: str) -> Any:
    """An exported name, imported from its submodule on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
