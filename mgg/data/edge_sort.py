"""Edge list -> target-major CSR at memory speed: a packed-key sort instead of a stable argsort.

Every edge ``k`` gets one int64 key ``dst[k] << b | k`` (``b`` = bits of ``E - 1``): sorting the
keys by value orders the edges by target and, inside a target, by input position -- the order a
stable argsort of ``dst`` gives, so the result is identical to it. numpy sorts int64 values
with its SIMD sort (several times faster than ``argsort(kind="stable")``); the sources are then
gathered through the low ``b`` bits of the sorted keys.

With more than one thread (`threads`, default: the usable cores, at most 16) the work runs as a
two-round parallel sort: each thread packs and sorts one contiguous share of the edges; splitter
rows cut the target range into one bucket per thread with about ``E / T`` edges each; each
thread then gathers its bucket's pieces from every sorted share, sorts the bucket and gathers
its sources. numpy's sort, take and element-wise kernels release the GIL, so the threads run in
parallel.

Keys need ``bits(N) + bits(E - 1) <= 63``; larger graphs (e.g. 2**32 nodes with 2**32
edges) fall back to ``argsort(kind="stable")``.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["csr_from_checked_edges", "default_threads", "id_range"]

#: below this many edges one thread does the whole build (thread start-up outweighs the gain)
_PARALLEL_MIN_EDGES = 1 << 21
_MAX_THREADS = 16
#: a key holds the target in its high bits and the edge position in its low bits
_KEY_BITS = 63


def default_threads() -> int:
    """Cores this process may run on (its CPU affinity), at most 16."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, _MAX_THREADS))


def _bits(v: int) -> int:
    return max(int(v).bit_length(), 1)


def _shares(e: int, t: int) -> list[tuple[int, int]]:
    return [(e * i // t, e * (i + 1) // t) for i in range(t)]


def id_range(ids: np.ndarray, threads: int | None = None) -> tuple[int, int]:
    """(min, max) of a non-empty integer array, its shares reduced on `threads` threads."""
    t = default_threads() if threads is None else max(1, threads)
    if t == 1 or len(ids) < _PARALLEL_MIN_EDGES:
        return int(ids.min()), int(ids.max())
    with ThreadPoolExecutor(t) as pool:
        parts = list(pool.map(lambda ab: (int(ids[ab[0]:ab[1]].min()), int(ids[ab[0]:ab[1]].max())),
                              _shares(len(ids), t)))
    return min(p[0] for p in parts), max(p[1] for p in parts)


def csr_from_checked_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                           threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Target-major CSR of edges ``src[k] -> dst[k]`` whose ids already lie in ``[0, num_nodes)``.

    Args:
        src, dst: integer [E] (any integer dtype; a memory map is read share by share).
        num_nodes: N.
        threads: worker threads (None: `default_threads`).

    Returns:
        ``(indptr int64 [N+1], indices int64 [E])``, rows in target order, edges inside a row
        in input order (the result of a stable argsort of ``dst``), duplicates kept.
    """
    e = len(dst)
    n = int(num_nodes)
    counts = np.bincount(np.asarray(dst), minlength=n) if e else np.zeros(n, np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if e == 0:
        return indptr, np.zeros(0, dtype=np.int64)
    b = _bits(e - 1)
    if _bits(n) + b > _KEY_BITS:  # every row start n' << b, n' <= N, fits
        order = np.argsort(np.asarray(dst), kind="stable")
        return indptr, np.asarray(src, dtype=np.int64)[order]
    t = default_threads() if threads is None else max(1, threads)
    if t == 1 or e < _PARALLEL_MIN_EDGES:
        keys = _packed(dst, 0, e, b)
        keys.sort()
        return indptr, _sources(src, keys, b)
    return indptr, _parallel(src, dst, indptr, b, t)


def _packed(dst: np.ndarray, lo: int, hi: int, b: int) -> np.ndarray:
    """int64 [hi - lo]: ``dst[k] << b | k`` for k in [lo, hi)."""
    keys = np.asarray(dst[lo:hi], dtype=np.int64) << b
    keys |= np.arange(lo, hi, dtype=np.int64)
    return keys


def _sources(src: np.ndarray, sorted_keys: np.ndarray, b: int, out: np.ndarray | None = None) -> np.ndarray:
    """src at the positions held in the low `b` bits of `sorted_keys` (overwritten), as int64."""
    np.bitwise_and(sorted_keys, (1 << b) - 1, out=sorted_keys)
    got = np.take(src, sorted_keys)
    if out is None:
        return got.astype(np.int64, copy=False)
    out[...] = got
    return out


def _parallel(src: np.ndarray, dst: np.ndarray, indptr: np.ndarray, b: int, t: int) -> np.ndarray:
    e = len(dst)
    n = len(indptr) - 1
    keys = np.empty(e, dtype=np.int64)
    shares = _shares(e, t)

    def sort_share(ab):
        lo, hi = ab
        keys[lo:hi] = _packed(dst, lo, hi, b)
        keys[lo:hi].sort()

    with ThreadPoolExecutor(t) as pool:
        list(pool.map(sort_share, shares))
        # bucket j holds the rows [rows[j], rows[j+1]): about E / t edges each
        rows = np.searchsorted(indptr, [e * j // t for j in range(t + 1)], side="left")
        rows[0], rows[-1] = 0, n
        rows = np.maximum.accumulate(rows)
        inner = rows[1:-1].astype(np.int64) << b  # first key of each inner bucket
        cuts = [np.concatenate([[lo], np.searchsorted(keys[lo:hi], inner) + lo, [hi]])
                for lo, hi in shares]  # [share][bucket boundary]
        buckets = np.empty(e, dtype=np.int64)

        def gather_bucket(j: int) -> None:
            at = int(indptr[rows[j]])
            for c in cuts:
                a, z = int(c[j]), int(c[j + 1])
                buckets[at:at + z - a] = keys[a:z]
                at += z - a

        list(pool.map(gather_bucket, range(t)))
        keys = None  # every key is in its bucket now: free the shares
        indices = np.empty(e, dtype=np.int64)

        def finish_bucket(j: int) -> None:
            a, z = int(indptr[rows[j]]), int(indptr[rows[j + 1]])
            part = buckets[a:z]
            part.sort()
            _sources(src, part, b, out=indices[a:z])

        list(pool.map(finish_bucket, range(t)))
    return indices
