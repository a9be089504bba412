"""The GPU sampler's random stream in plain Python: what `sample_uniform` (mgg/kernels/sample.cu)
must return for a given kernel seed, bit for bit.

Per seed slot s: base = splitmix64(seed ^ splitmix64(s)); Floyd's algorithm over the row's edge
positions draws t_q = bounded(splitmix64(base + q), j + 1) for j = deg - k + q and takes t_q
unless already taken, else j; the sampled neighbors are indices[beg + t_q] in draw order. A row
with deg <= fanout is taken whole, in CSR order.
"""
from __future__ import annotations

import numpy as np

__all__ = ["splitmix64", "floyd_sample_reference"]

_M = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64's finaliser of x + golden ratio (64-bit wrap-around), as the kernel's."""
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def _bounded(h: int, n: int) -> int:
    return ((h >> 32) * n) >> 32


def floyd_sample_reference(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanout: int,
                           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr int64 [B + 1], nbr int64 [ptr[-1]]) of `sample_neighbors_cuda(..., fanout, seed)`."""
    ptr = np.zeros(len(seeds) + 1, dtype=np.int64)
    out: list[int] = []
    seed &= _M
    for s, node in enumerate(np.asarray(seeds, dtype=np.int64)):
        beg, deg = int(indptr[node]), int(indptr[node + 1] - indptr[node])
        k = deg if fanout < 0 else min(deg, fanout)
        if k == deg:
            out.extend(int(v) for v in indices[beg:beg + deg])
        else:
            base = splitmix64(seed ^ splitmix64(s))
            taken: list[int] = []
            for q in range(k):
                j = deg - k + q
                t = _bounded(splitmix64((base + q) & _M), j + 1)
                taken.append(j if t in taken else t)
            out.extend(int(indices[beg + t]) for t in taken)
        ptr[s + 1] = len(out)
    return ptr, np.asarray(out, dtype=np.int64)
