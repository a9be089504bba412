"""Memory maps of the members of an ``.npz`` archive (no member is read until it is touched).

``np.savez`` (what `mgg.data.save_npz` writes by default) stores every ``.npy`` member without
compression, so each member's array data is a contiguous byte range of the archive: its offset is
the member's local zip header (30 bytes + file name + extra field) plus the ``.npy`` header. That
range is mapped read-only with ``np.memmap``: slicing it reads only the pages of the slice.

Members stored with compression (``np.savez_compressed``) cannot be mapped; they are read whole
(``mmap_members`` returns them as ordinary arrays). Re-saving such a file uncompressed
(``mgg.data.save_npz(g, path)``) makes it mappable.

Every size is checked against the file length before mapping, so a truncated archive or member
raises a one-line `GraphFormatError` naming the file and the member, never a bus error later.
"""
from __future__ import annotations

import os
import struct
import zipfile
import zlib

import numpy as np

from .validate import GraphFormatError

__all__ = ["mmap_members"]

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # zip local file header, 30 bytes
_LOCAL_MAGIC = b"PK\x03\x04"


def _member_name(info: zipfile.ZipInfo) -> str:
    return info.filename[:-4] if info.filename.endswith(".npy") else info.filename


def _map_stored(path: str, f, info: zipfile.ZipInfo, file_size: int, limit: int) -> np.ndarray:
    """np.memmap of one uncompressed member (sizes checked against the file first). `limit`: where
    the next member or the central directory begins (the member's data must end before it)."""
    key = _member_name(info)
    f.seek(info.header_offset)
    raw = f.read(_LOCAL_HEADER.size)
    if len(raw) < _LOCAL_HEADER.size:
        raise GraphFormatError(path, key, f"truncated: the local header at byte {info.header_offset} lies past the end of the file ({file_size} bytes)")
    fields = _LOCAL_HEADER.unpack(raw)
    if fields[0] != _LOCAL_MAGIC:
        raise GraphFormatError(path, key, f"corrupt archive: no local header at byte {info.header_offset}")
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]  # + name + extra
    end = start + info.file_size
    if end > file_size:
        raise GraphFormatError(path, key, f"truncated: the member needs bytes [{start}, {end}) but the file has {file_size} bytes")
    if end > limit:
        raise GraphFormatError(path, key, f"corrupt archive: the member's bytes [{start}, {end}) run into the next entry at byte {limit}")
    f.seek(start)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    except ValueError as e:
        raise GraphFormatError(path, key, f"not a readable .npy member: {e}") from e
    if dtype.hasobject:
        raise GraphFormatError(path, key, "object arrays (pickles) are refused")
    data = f.tell()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if data + nbytes > end:
        raise GraphFormatError(path, key, f"truncated: its header says shape {tuple(shape)} {dtype} "
                               f"({nbytes} bytes) but the member holds {end - data} data bytes")
    if len(shape) == 0 or nbytes == 0:  # scalars and empty arrays: read, not mapped
        buf = f.read(nbytes)
        return np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()
    return np.memmap(path, dtype=dtype, mode="r", offset=data, shape=tuple(shape), order="F" if fortran else "C")


def _read_compressed(path: str, z: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    key = _member_name(info)
    try:
        with z.open(info) as m:
            return np.lib.format.read_array(m, allow_pickle=False)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, ValueError) as e:
        raise GraphFormatError(path, "file", f"member {key!r}: not a readable compressed member (truncated or corrupt?): {e}") from e


def mmap_members(path: str) -> dict[str, np.ndarray]:
    """{key: array} of the ``.npz`` archive at `path`: ``np.memmap`` (read-only) for members
    stored without compression, a full read for compressed ones.

    Raises:
        GraphFormatError: the file is not a zip archive, a member is not a ``.npy`` array, or a
        member is truncated (file shorter than its headers say) -- naming the file and member.
    """
    path = os.fspath(path)
    file_size = os.path.getsize(path)
    try:
        z = zipfile.ZipFile(path)
    except Exception as e:  # noqa: BLE001 - BadZipFile, OSError, struct errors of a damaged archive
        raise GraphFormatError(path, "file", f"not a .npz (zip) archive, or truncated: {e}") from e
    out: dict[str, np.ndarray] = {}
    with z, open(path, "rb") as f:
        starts = sorted(i.header_offset for i in z.infolist()) + [getattr(z, "start_dir", file_size)]
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            try:
                if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
                    limit = min(o for o in starts if o > info.header_offset) if starts[-1] > info.header_offset else file_size
                    out[_member_name(info)] = _map_stored(path, f, info, file_size, limit)
                else:
                    out[_member_name(info)] = _read_compressed(path, z, info)
            except GraphFormatError:
                raise
            except Exception as e:  # noqa: BLE001 - any damage is a format error, never a crash
                raise GraphFormatError(path, _member_name(info), f"unreadable member (corrupt archive?): {type(e).__name__}: {e}") from e
    return out
