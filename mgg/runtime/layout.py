"""Row layout of embeddings in symmetric memory and in the CUDA kernels.

The kernels read rows as float4, so a row of D floats is stored padded to `padded_dim(D)` floats
(a multiple of 4, 16-byte aligned rows, at least one float4). The NVSHMEM store allocates this
width, the launchers pass `padded_dim(D) // 4` to the kernels, and the shared-memory needs of the
kernel variants (mgg.kernels.variants) are computed at this width.
"""
from __future__ import annotations

__all__ = ["padded_dim"]


def padded_dim(dim: int) -> int:
    """Row length in floats of a [*, dim] embedding: dim rounded up to a multiple of 4, at least 4.

    padded_dim(0) == 4: a zero-width array still has one float4 per row (the kernels' unit).
    """
    dim = int(dim)
    if dim < 0:
        raise ValueError(f"embedding width must be >= 0, got {dim}")
    return max(4, (dim + 3) // 4 * 4)
