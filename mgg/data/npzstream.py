"""Write an ``.npz`` whose members are produced in chunks, never whole in memory.

A graph too large for the host (papers-like at full size: 13 GB of indices, 57 GB of features)
is generated in row chunks (`mgg.data.generators.PowerLawParts`) and each chunk is appended to its
member as it is drawn. Members are stored uncompressed (ZIP_STORED, zip64), so the file is exactly
what `save_npz` writes and what `load_npz(mmap=True)` maps. The write is atomic: a temporary file
beside the target, renamed over it only when every member is complete.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..atomic import atomic_path

__all__ = ["StreamedMember", "write_npz_stream"]


@dataclass
class StreamedMember:
    """A member written from ``chunks``: arrays (numpy or CPU/GPU torch) whose concatenation
    along axis 0 has exactly ``shape`` and ``dtype``; counted, so a short or long stream fails."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: Iterable[Any]


def _as_numpy(chunk: Any, dtype: np.dtype) -> np.ndarray:
    if hasattr(chunk, "detach"):  # a torch tensor, possibly on a GPU
        chunk = chunk.detach().cpu().numpy()
    return np.ascontiguousarray(chunk, dtype=dtype)


def _write_member(z: zipfile.ZipFile, name: str, value: Any) -> None:
    if isinstance(value, StreamedMember):
        shape, dtype, chunks = tuple(int(s) for s in value.shape), np.dtype(value.dtype), value.chunks
    else:
        arr = np.asarray(value)
        shape, dtype, chunks = arr.shape, arr.dtype, [arr] if arr.ndim else [arr.reshape(1)]
    if dtype.hasobject:
        raise TypeError(f"member {name!r}: object arrays cannot be written")
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    want = int(np.prod(shape, dtype=np.int64))
    with z.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                 "fortran_order": False, "shape": shape})
        done = 0
        for chunk in chunks:
            a = _as_numpy(chunk, dtype)
            if len(shape) > 1 and a.shape[1:] != shape[1:]:
                raise ValueError(f"member {name!r}: chunk of shape {a.shape} does not fit rows of {shape[1:]}")
            done += a.size
            if done > want:
                raise ValueError(f"member {name!r}: chunks hold more than the {want} elements of shape {shape}")
            f.write(a.data)
        if done != want:
            raise ValueError(f"member {name!r}: chunks hold {done} elements, shape {shape} needs {want}"
                             f" ({done // max(1, row)} of {shape[0] if shape else 1} rows)")


def write_npz_stream(path: str | os.PathLike, members: dict[str, Any],
                     progress: Callable[[str], None] | None = None) -> None:
    """Write ``members`` ({name: array or StreamedMember}, in order) to the ``.npz`` at `path`
    atomically. Arrays are written whole; a StreamedMember chunk by chunk (peak memory: one chunk).
    `progress(name)` is called as each member starts. Raises ValueError (and leaves any existing
    file at `path` untouched) when a stream's length does not match its shape."""

    def fill(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, value in members.items():
                if progress is not None:
                    progress(name)
                _write_member(z, name, value)

    atomic_path(path, fill)


def chunk_values(chunks: Iterable[tuple[int, int, Any]]) -> Iterator[Any]:
    """The arrays of an iterator of (begin, end, array) triples, checking they are contiguous."""
    at = 0
    for b, e, a in chunks:
        if b != at:
            raise ValueError(f"chunks are not contiguous: expected one starting at {at}, got [{b}, {e})")
        at = e
        yield a
