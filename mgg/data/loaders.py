"""All file/object loaders in one namespace (each lives in its own small module)."""
from __future__ import annotations

from .edgelist import EDGELIST_SUFFIXES, load_edgelist, save_edgelist
from .karate import load_karate
from .npz import atomic_write, load_npz, save_npz
from .ogb import is_ogb_folder, load_ogb
from .pyg import HAVE_PYG, from_pyg
from .scipy_io import from_scipy, to_scipy

__all__ = ["load_npz", "save_npz", "atomic_write", "from_scipy", "to_scipy", "from_pyg", "HAVE_PYG",
           "load_ogb", "is_ogb_folder", "load_edgelist", "save_edgelist", "EDGELIST_SUFFIXES",
           "load_karate"]
