"""Decoding, checking and encoding of one lookup request of the service (no I/O, no threads).

A request names a table and carries EmbeddingBag input (`indices`, `offsets`, optional
`per_sample_weights`) as JSON or as an npz archive; `parse_lookup` turns it into a validated
`BagInput` and refuses (`BadRequest`, an HTTP status and a one-line reason) anything malformed,
out of range, or asking for more than the service's per-request bounds: `max_bags` bags, and a
reply over `max_reply_bytes` (bags x embedding_dim floats, sized for the reply's format before any
lookup runs). A large JSON body's number lists are parsed by numpy (`json_body`), so decoding
costs a few times the body, not a Python object per number.
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from . import json_body
from .json_body import MAX_JSON_DEPTH, SMALL_JSON_BYTES, JSONBodyError
from .validate import BagInput, check_bag_input

__all__ = ["BadRequest", "RequestLimits", "LookupRequest", "decode_json", "decode_lookup_json", "decode_npz",
           "parse_lookup", "MAX_JSON_DEPTH", "SMALL_JSON_BYTES", "NUMBER_FIELDS",
           "encode_json_reply", "encode_npy_reply", "reply_bytes_bound", "JSON_FIELDS", "NPZ_ARRAYS"]

JSON_FIELDS = frozenset({"table", "indices", "offsets", "per_sample_weights"})
NPZ_ARRAYS = frozenset({"indices", "offsets", "per_sample_weights"})

#: most bytes one float32 takes in a JSON reply: sign, 9 significant digits, point, exponent
#: ("-1.2345679e-38") and the separator
JSON_FLOAT_BYTES = 16
NPY_HEADER_BYTES = 128
#: floats a JSON reply encodes at a time
JSON_SLICE_FLOATS = 1 << 14


class BadRequest(Exception):
    """A request the service refuses: HTTP `status` (4xx, or 503/504 for service states) and reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RequestLimits:
    """Per-request bounds (one source: the service's `ServiceConfig`)."""

    max_body_bytes: int
    max_bags: int
    max_reply_bytes: int


@dataclass
class LookupRequest:
    """A validated lookup: table index, its name and width, and the flattened bag input
    (indices int64 [n], offsets int64 [B + 1] from 0 to n)."""

    table: int
    name: str
    dim: int
    bag: BagInput


#: the JSON fields that are lists of numbers, and the kind each must hold
NUMBER_FIELDS = {"indices": "int", "offsets": "int", "per_sample_weights": "float"}


def decode_json(body: bytes) -> dict:
    """The JSON object of a small body (orjson); 400 on malformed JSON (NaN/Infinity and invalid
    UTF-8 included), nesting deeper than MAX_JSON_DEPTH, or a non-object."""
    try:
        return json_body.decode_json(body)
    except JSONBodyError as e:
        raise BadRequest(e.status, str(e)) from None


def decode_lookup_json(body: bytes) -> dict:
    """The JSON object of a lookup body; a large body's number lists come back as numpy arrays
    parsed without a Python object per number (`json_body`), so its cost stays a few times its
    size. 400 on anything `decode_json` refuses."""
    try:
        return json_body.decode_json_object(body, NUMBER_FIELDS)
    except JSONBodyError as e:
        raise BadRequest(e.status, str(e)) from None


def decode_npz(body: bytes, max_body_bytes: int) -> dict[str, np.ndarray]:
    """The arrays of an npz body (no pickles); 413 when its members expand past `max_body_bytes`."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as z:
            if sum(i.file_size for i in z.infolist()) > max_body_bytes:
                raise BadRequest(413, f"npz body expands beyond --max-body-bytes={max_body_bytes}")
            with np.load(io.BytesIO(body), allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
    except BadRequest:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile/np.load raise many kinds
        raise BadRequest(400, f"malformed npz body: {type(e).__name__}: {e}") from None


def reply_bytes_bound(bags: int, dim: int, fmt: str) -> int:
    """Upper bound of the reply's size for `bags` x `dim` floats in format "json" or "npy"."""
    if fmt == "npy":
        return NPY_HEADER_BYTES + 4 * bags * dim
    return 256 + bags * (JSON_FLOAT_BYTES * dim + 4)


def parse_lookup(tables: list, names: dict[str, int], table: Any, indices: Any, offsets: Any, psw: Any,
                 limits: RequestLimits, fmt: str) -> LookupRequest:
    """Validate one request against `tables` (TableConfigs with shapes) and `limits`.

    Statuses: 404 unknown table, 422 ids out of range, 413 over `max_bags` or `max_reply_bytes`,
    400 anything else malformed."""
    if not isinstance(table, str):
        raise BadRequest(400, "\"table\" must be a string")
    if table not in names:
        raise BadRequest(404, f"unknown table {table!r}; tables: {sorted(names)}")
    t = names[table]
    cfg = tables[t]
    if indices is None or offsets is None:
        raise BadRequest(400, "\"indices\" and \"offsets\" are required")
    off = _ints(offsets, "offsets")
    if off.size > limits.max_bags:  # before any per-bag work
        raise BadRequest(413, f"{off.size} bags exceed --max-bags={limits.max_bags}")
    need = reply_bytes_bound(int(off.size), cfg.embedding_dim, fmt)
    if need > limits.max_reply_bytes:
        raise BadRequest(413, f"the reply of {off.size} bags x {cfg.embedding_dim} floats ({fmt}, up to {need} "
                              f"bytes) exceeds --max-reply-bytes={limits.max_reply_bytes}")
    try:
        bag = check_bag_input(_ints(indices, "indices"), off, None if psw is None else _floats(psw),
                              num_embeddings=cfg.num_embeddings, mode=cfg.mode, include_last_offset=False,
                              what=f"table {table!r}")
    except (ValueError, TypeError, IndexError) as e:
        raise BadRequest(422 if isinstance(e, IndexError) else 400, str(e)) from None
    return LookupRequest(t, table, cfg.embedding_dim, bag)


def encode_json_reply(name: str, out: np.ndarray) -> list[bytes]:
    """`{"table", "shape", "embeddings"}` with each float32 written in its shortest form that
    reads back to the same float32, as pieces (the rows in slices of JSON_SLICE_FLOATS floats,
    so no single encoding step holds the interpreter long)."""
    out = np.ascontiguousarray(out, dtype=np.float32)
    pieces = [orjson.dumps({"table": name, "shape": list(out.shape)})[:-1] + b',"embeddings":[']
    rows = max(1, JSON_SLICE_FLOATS // max(1, out.shape[1]))
    for a in range(0, out.shape[0], rows):
        if a:
            pieces.append(b",")
        pieces.append(orjson.dumps(out[a: a + rows], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    pieces.append(b"]}")
    return pieces


def encode_npy_reply(out: np.ndarray) -> list:
    """An .npy file of `out` (float32) as pieces: its header and the array itself (no copy)."""
    out = np.ascontiguousarray(out, dtype=np.float32)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(out))
    return [head.getvalue(), out]


def _ints(x: Any, what: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        arr = x
    else:
        if not isinstance(x, list):
            raise BadRequest(400, f"\"{what}\" must be a list of integers")
        try:
            arr = np.asarray(x)
        except (ValueError, OverflowError):
            raise BadRequest(400, f"\"{what}\" must be a flat list of integers") from None
        if arr.size == 0:
            arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise BadRequest(400, f"\"{what}\" must be a 1-D list of integers (got {arr.dtype} with {arr.ndim} dims)")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise BadRequest(400, f"\"{what}\": value too large")
    return arr.astype(np.int64, copy=False)


def _floats(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        arr = x
    else:
        if not isinstance(x, list):
            raise BadRequest(400, "\"per_sample_weights\" must be a list of numbers")
        try:
            arr = np.asarray(x)
        except (ValueError, OverflowError):
            raise BadRequest(400, "\"per_sample_weights\" must be a flat list of numbers") from None
    if arr.dtype.kind not in "iuf" or arr.ndim != 1:
        raise BadRequest(400, f"\"per_sample_weights\" must be a 1-D list of numbers (got {arr.dtype})")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise BadRequest(400, "\"per_sample_weights\" must be finite")
    return arr
