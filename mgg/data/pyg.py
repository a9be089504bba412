"""PyTorch Geometric ``Data`` -> Graph (torch_geometric itself is optional)."""
from __future__ import annotations

import importlib.util

import numpy as np

from ._build import graph_from_edges
from .graph import Graph
from .validate import GraphFormatError

__all__ = ["from_pyg", "HAVE_PYG"]

#: torch_geometric is installed (found, not imported: importing it pulls torch._dynamo in, 5.7 s of
#: every `python -m mgg.train` start on the GPU machine; from_pyg only reads attributes)
HAVE_PYG = importlib.util.find_spec("torch_geometric") is not None


def _np(v):
    if v is None:
        return None
    if hasattr(v, "detach"):  # torch.Tensor
        return v.detach().cpu().numpy()
    return np.asarray(v)


def from_pyg(data, name: str = "pyg", to_undirected: bool = False) -> Graph:
    """Graph from a PyG ``Data`` (or any object with the same attributes).

    Reads ``edge_index`` ([2, E], row 0 source, row 1 target), ``num_nodes``, and optionally
    ``x``, ``y`` ([N] or [N, 1]), ``train_mask``, ``val_mask``, ``test_mask``. Edge attributes
    are ignored. Tensors are copied to CPU numpy arrays.
    """
    source = f"<pyg {name}>"
    ei = _np(getattr(data, "edge_index", None))
    if ei is None:
        raise GraphFormatError(source, "edge_index", "missing")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphFormatError(source, "edge_index", f"must have shape [2, E], got {ei.shape}")
    n = getattr(data, "num_nodes", None)
    node = {k: _np(getattr(data, k, None)) for k in ("x", "y", "train_mask", "val_mask", "test_mask")}
    return graph_from_edges(ei[0], ei[1], source=source, name=name,
                            num_nodes=None if n is None else int(n),
                            to_undirected=to_undirected, **node)
