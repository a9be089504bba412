"""Backends: which one "auto" means here, and the symmetric store of each.

This module sits above the kernels (it hands the NVSHMEM store its row-gather kernel), so the
stores themselves (mgg.runtime.store, mgg.runtime.nvshmem_store) import no kernel and no other
store backend. The executors of a backend come from mgg.graph.factory.
"""
from __future__ import annotations

from ..knobs import BACKENDS
from ..runtime.comm import Communicator
from ..runtime.store import SymmetricStore, cpu_store

__all__ = ["BACKENDS", "resolve_backend", "make_store", "gpu_unavailable_reason", "GPU_INSTALL_HINT"]

#: how to install what the GPU backend needs (the `gpu` extra of pyproject.toml)
GPU_INSTALL_HINT = 'install the GPU packages with: pip install -e ".[gpu]" (CuPy, nvshmem4py, cuda-core)'


def gpu_unavailable_reason() -> str:
    """Why the GPU backend cannot run here ("" when it can): no CUDA GPU visible to torch, or a
    missing package (CuPy, nvshmem4py, cuda-core). Imports nothing heavier than those."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False); use --backend cpu (or auto)"
    for module, package in (("cupy", "cupy-cuda13x"), ("nvshmem.core", "nvshmem4py-cu13"),
                            ("cuda.core", "cuda-core")):
        try:
            __import__(module)
        except ImportError as e:
            return f"the Python package {package} is missing (import {module}: {e}); {GPU_INSTALL_HINT}"
        except Exception as e:  # noqa: BLE001 - e.g. a library that loads but finds no driver
            return f"{package} cannot be loaded ({type(e).__name__}: {e})"
    return ""



def resolve_backend(backend: str) -> str:
    """"auto" -> "gpu" when CUDA and NVSHMEM are usable, else "cpu"."""
    if backend != "auto":
        return backend
    try:
        import torch

        if torch.cuda.is_available():
            import nvshmem.core  # noqa: F401

            return "gpu"
    except ImportError:
        pass
    return "cpu"


def make_store(comm: Communicator, backend: str = "cpu") -> SymmetricStore:
    """The store for `backend` ("cpu" -> MPI RMA or LocalStore; "gpu" -> NVSHMEM, reading other
    PEs' rows with the mgg_halo_gather kernel)."""
    if backend == "gpu":
        from ..kernels.gpu import halo_gather
        from ..runtime.nvshmem_store import NvshmemStore

        return NvshmemStore(comm, gather_rows=halo_gather)
    if backend != "cpu":
        raise ValueError(f"unknown store backend {backend!r}")
    return cpu_store(comm)
