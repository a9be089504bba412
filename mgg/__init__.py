"""mgg: full-graph multi-GPU GNN training (SPMD under mpirun; NVSHMEM on GPU, MPI RMA on CPU).

Importing `mgg` is cheap: torch and MPI are only imported by the subpackages that need them
(`mgg.runtime`, `mgg.nn`, `mgg.train`).
"""
__all__ = ["__version__"]


def __getattr__(name: str):
    """`mgg.__version__`, looked up lazily in the installed distribution (mgg/version.py)."""
    if name == "__version__":
        from .version import version

        return version()
    raise AttributeError(f"module 'mgg' has no attribute {name!r}")
