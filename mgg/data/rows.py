"""Read rows [lo, hi) of an array that may be a memory map of a file, without mapping them.

Slicing an ``np.memmap`` faults its pages into the process: they count in its resident set and
stay there while the map lives (clean, so reclaimable, but a rank's peak RSS then holds every
row it ever looked at, twice when the rows are copied). `read_rows` reads the byte range with
one positioned read instead (``np.fromfile`` at the row's offset): the result is an ordinary
array, and the file's pages go through the page cache only.
"""
from __future__ import annotations

import mmap

import numpy as np

__all__ = ["read_rows"]


def read_rows(a, lo: int, hi: int) -> np.ndarray:
    """A new array holding ``a[lo:hi]`` (axis 0). For a C-ordered ``np.memmap`` that maps a file
    directly (not a view of one), the rows are read from the file; anything else is sliced and
    copied (``np.array(a[lo:hi])``)."""
    lo, hi = int(lo), int(max(lo, hi))
    if (isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap) and a.filename
            and a.flags.c_contiguous and a.ndim >= 1 and 0 <= lo <= hi <= a.shape[0]):
        row = int(np.prod(a.shape[1:], dtype=np.int64))
        out = np.fromfile(a.filename, dtype=a.dtype, count=(hi - lo) * row,
                          offset=int(a.offset) + lo * row * a.dtype.itemsize)
        if out.size == (hi - lo) * row:
            return out.reshape((hi - lo,) + a.shape[1:])
    return np.array(a[lo:hi])
