"""mgg: full-graph multi-GPU GNN training (SPMD under mpirun; NVSHMEM on GPU, MPI RMA on CPU).

Importing `mgg` is cheap: torch and MPI are only imported by the subpackages that need them
(`mgg.runtime`, `mgg.nn`, `mgg.train`).
"""
__version__ = "0.1.0"

__all__ = ["__version__"]
