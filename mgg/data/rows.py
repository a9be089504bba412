"""Read rows [lo, hi) of an array that may be a memory map of a file, without mapping them.

Slicing an ``np.memmap`` faults its pages into the process: they count in its resident set and
stay there while the map lives (clean, so reclaimable, but a rank's peak RSS then holds every
row it ever looked at, twice when the rows are copied). `read_rows` reads the byte range with
positioned reads instead (``os.preadv`` at the rows' offset, blocks on a thread pool): the result is an ordinary
array, and the file's pages go through the page cache only.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["read_rows", "mapped_file", "pread_into"]


def read_rows(a, lo: int, hi: int) -> np.ndarray:
    """A new array holding ``a[lo:hi]`` (axis 0). For a C-ordered ``np.memmap`` that maps a file
    directly (not a view of one), the rows are read from the file; anything else is sliced and
    copied (``np.array(a[lo:hi])``)."""
    lo, hi = int(lo), int(max(lo, hi))
    if mapped_file(a) is not None and a.ndim >= 1 and 0 <= lo <= hi <= a.shape[0]:
        row = int(np.prod(a.shape[1:], dtype=np.int64))
        out = np.empty((hi - lo) * row, dtype=a.dtype)
        if pread_into(a.filename, out, int(a.offset) + lo * row * a.dtype.itemsize):
            return out.reshape((hi - lo,) + a.shape[1:])
    return np.array(a[lo:hi])


def mapped_file(a) -> tuple[str, int] | None:
    """(path, byte offset of a's first element in the file) when `a` is a C-ordered ``np.memmap``
    that maps a file directly (not a view of one): its bytes can then be read from the file
    instead of through the map. None otherwise."""
    if isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap) and a.filename and a.flags.c_contiguous:
        return str(a.filename), int(a.offset)
    return None


#: bytes per positioned read; reads of more than one block run on a thread pool
READ_BLOCK = 64 << 20


def pread_into(path: str, out: np.ndarray, offset: int) -> bool:
    """Fill `out` (contiguous) with the file's bytes from `offset`: positioned reads of READ_BLOCK
    bytes, several at once (os.preadv releases the GIL). False when the file is too short."""
    buf = memoryview(out).cast("B")
    total = buf.nbytes

    def read(start: int) -> bool:
        end = min(start + READ_BLOCK, total)
        while start < end:
            got = os.preadv(fd, [buf[start:end]], offset + start)
            if got <= 0:
                return False
            start += got
        return True

    fd = os.open(path, os.O_RDONLY)
    try:
        starts = range(0, total, READ_BLOCK)
        threads = min(len(starts), os.cpu_count() or 1, 8)
        if threads <= 1:
            return all(read(s) for s in starts)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            return all(pool.map(read, starts))
    finally:
        os.close(fd)
