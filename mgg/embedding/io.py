"""Table files: .npy and safetensors (parsed here, no dependency), tables.json, atomic writes.

safetensors layout: 8-byte little-endian header length n, n bytes of JSON
``{"name": {"dtype": "F32", "shape": [N, D], "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the raw little-endian data; offsets are relative to the end of the header.
"""
from __future__ import annotations

import json
import os
import re
import struct
from typing import Any

import numpy as np

from ..atomic import atomic_path, atomic_write, atomic_write_json
from .sharding import SHARDINGS
from .table import DEFAULT_MODE, TableConfig
from .validate import MODES

__all__ = ["load_tables_json", "open_table", "read_safetensors_header", "write_npy_atomic",
           "write_json_atomic", "save_safetensors", "NAME_RE"]

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_ST_DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
_MAX_HEADER = 100 << 20


def load_tables_json(path: str) -> list[TableConfig]:
    """Parse and validate tables.json: a list (or {"tables": [...]}) of {name, path, mode?, sharding?, key?}.

    Relative paths are relative to the JSON file's folder; mode defaults to `DEFAULT_MODE` ("sum").
    The tables come back without their shape (`TableConfig.with_shape` once the file is open).
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read tables file: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    entries = doc.get("tables") if isinstance(doc, dict) else doc
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty list of tables (or {{\"tables\": [...]}})")
    root = os.path.dirname(os.path.abspath(path))
    specs, seen = [], set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"{path}: table #{i} is not an object")
        unknown = set(e) - {"name", "path", "mode", "sharding", "key"}
        if unknown:
            raise ValueError(f"{path}: table #{i}: unknown fields {sorted(unknown)}")
        name, p = e.get("name"), e.get("path")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"{path}: table #{i}: name must match {NAME_RE.pattern}, got {name!r}")
        if name in seen:
            raise ValueError(f"{path}: duplicate table name {name!r}")
        seen.add(name)
        if not isinstance(p, str) or not p:
            raise ValueError(f"{path}: table {name!r}: missing path")
        mode, sharding = e.get("mode", DEFAULT_MODE), e.get("sharding", "range")
        if mode not in MODES:
            raise ValueError(f"{path}: table {name!r}: mode must be one of {MODES}, got {mode!r}")
        if sharding not in SHARDINGS:
            raise ValueError(f"{path}: table {name!r}: sharding must be one of {SHARDINGS}, got {sharding!r}")
        key = e.get("key")
        if key is not None and not isinstance(key, str):
            raise ValueError(f"{path}: table {name!r}: key must be a string")
        specs.append(TableConfig(None, None, mode, sharding, name, p if os.path.isabs(p) else os.path.join(root, p), key))
    return specs


def read_safetensors_header(path: str) -> tuple[dict[str, Any], int]:
    """(header dict without __metadata__, byte offset of the data section); validated against the file size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: bad safetensors header length {n}")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: bad safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: bad safetensors header (not an object)")
    header.pop("__metadata__", None)
    data = 8 + n
    for name, h in header.items():
        try:
            dt, shape, (a, b) = h["dtype"], [int(s) for s in h["shape"]], h["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: bad safetensors entry {name!r}") from None
        if dt in _ST_DTYPES and (b - a != int(np.prod(shape)) * _ST_DTYPES[dt].itemsize or a < 0 or data + b > size):
            raise ValueError(f"{path}: safetensors entry {name!r}: data_offsets do not match shape/dtype/file size")
    return header, data


def open_table(spec: TableConfig) -> np.ndarray:
    """The table as a read-only array [N, D] (memory-mapped; rows are read on demand)."""
    path = spec.path
    if path is None:
        raise ValueError(f"table {spec.name!r}: no file (path) to open")
    if not os.path.isfile(path):
        raise ValueError(f"table {spec.name!r}: file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(9)
    magic = head[:6]
    # a safetensors file starts with an 8-byte little-endian header length, then the JSON header
    looks_safetensors = len(head) == 9 and head[8:9] == b"{" and 0 < struct.unpack("<Q", head[:8])[0] <= _MAX_HEADER
    if magic != b"\x93NUMPY" and path.lower().endswith(".npy"):
        raise ValueError(f"table {spec.name!r}: {path} is not a .npy file (no NumPy header; write it with numpy.save)")
    if magic == b"\x93NUMPY":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"table {spec.name!r}: {path}: {e}") from None
    elif path.endswith(".safetensors") or looks_safetensors:
        header, data = read_safetensors_header(path)
        key = spec.key
        if key is None:
            if len(header) != 1:
                raise ValueError(f"table {spec.name!r}: {path} holds {len(header)} tensors; set \"key\" in tables.json")
            key = next(iter(header))
        if key not in header:
            raise ValueError(f"table {spec.name!r}: no tensor {key!r} in {path}")
        h = header[key]
        if h["dtype"] not in _ST_DTYPES:
            raise ValueError(f"table {spec.name!r}: unsupported safetensors dtype {h['dtype']} (F32, F64, F16, BF16)")
        shape = tuple(int(s) for s in h["shape"])
        arr = np.memmap(path, dtype=_ST_DTYPES[h["dtype"]], mode="r", offset=data + h["data_offsets"][0], shape=shape)
        if h["dtype"] == "BF16":
            arr = _Bf16View(arr)
    else:
        raise ValueError(f"table {spec.name!r}: {path} is neither .npy nor safetensors (checked its first bytes)")
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"table {spec.name!r}: expected a 2-D table [rows, dim], got shape {tuple(arr.shape)}")
    if not isinstance(arr, _Bf16View) and arr.dtype.kind != "f":
        raise ValueError(f"table {spec.name!r}: expected floating point values, got {arr.dtype}")
    return arr


class _Bf16View:
    """Row access to a bfloat16 memmap, converted to float32 on read."""

    def __init__(self, raw: np.ndarray):
        self.raw, self.shape, self.ndim, self.dtype = raw, raw.shape, raw.ndim, np.dtype(np.float32)

    def __getitem__(self, k):
        return (np.asarray(self.raw[k]).astype(np.uint32) << 16).view(np.float32)


def save_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """Write a safetensors file (F32/F64/F16 arrays)."""
    names = {"<f4": "F32", "<f8": "F64", "<f2": "F16"}
    header, blobs, pos = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype.str not in names:
            raise TypeError(f"save_safetensors: unsupported dtype {a.dtype}")
        blobs.append(a.tobytes())
        header[name] = {"dtype": names[a.dtype.str], "shape": list(a.shape), "data_offsets": [pos, pos + len(blobs[-1])]}
        pos += len(blobs[-1])
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    def write(f) -> None:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)

    atomic_write(path, write)


def write_npy_atomic(path: str, shape: tuple[int, int], dtype, fill) -> None:
    """Create `path` atomically: `fill(memmap)` writes a temp .npy in the same folder, then os.replace."""
    def make(tmp: str) -> None:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        fill(mm)
        mm.flush()
        del mm

    atomic_path(path, make)


def write_json_atomic(path: str, obj: Any) -> None:
    atomic_write_json(path, obj)
