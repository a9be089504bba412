"""Fast, strict reading of numeric text tables (edge lists, OGB csv files), plain or gzipped.

numpy's C ``loadtxt`` does the work; when it fails, the file is re-scanned line by line to
report the first bad line (1-based, counting comments) as a :class:`GraphFormatError`.
"""
from __future__ import annotations

import gzip
import os
import warnings
import zlib

import numpy as np

from .validate import GraphFormatError

_COMMENTS = ("#", "%")


def _open_text(path: str):
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, "rt", encoding="utf-8", errors="replace")


def _sniff_delimiter(path: str) -> str | None:
    """',' if the first data line contains a comma, else None (any whitespace)."""
    with _open_text(path) as f:
        for line in f:
            s = line.strip()
            if not s or s.startswith(_COMMENTS):
                continue
            return "," if "," in s else None
    return None


def _diagnose(path: str, field: str, ncols: int | None, dtype, delimiter: str | None) -> GraphFormatError | None:
    """Re-scan ``path`` to find the first malformed line."""
    conv = int if np.dtype(dtype).kind in "iu" else float
    first = True
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            s = line.strip()
            if not s or s.startswith(_COMMENTS):
                continue
            toks = [t.strip() for t in s.split(delimiter)] if delimiter else s.split()
            if first and toks and not any(_is_number(t) for t in toks):  # "src,dst", "source target"
                return GraphFormatError(path, field, f"line {lineno}: {s[:80]!r} is not data but looks like a header "
                                        f"line: start it with '#' (a comment) or delete it")
            first = False
            if ncols is not None and len(toks) != ncols:
                return GraphFormatError(path, field, f"line {lineno}: expected {ncols} columns, found {len(toks)}: {s[:80]!r}")
            for t in toks:
                try:
                    conv(t)
                except ValueError:
                    kind = "integer" if conv is int else "number"
                    return GraphFormatError(path, field, f"line {lineno}: token {t[:40]!r} is not an {kind}" if kind == "integer"
                                            else f"line {lineno}: token {t[:40]!r} is not a {kind}")
    return None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _has_non_ascii(path: str) -> bool:
    """Whether the (decompressed) file holds a byte >= 0x80 (a fast C scan in 1 MiB chunks)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 20):
            if not chunk.isascii():
                return True
    return False


def _ascii_data_lines(path: str, field: str):
    """The lines of a file with non-ASCII bytes, for loadtxt: comment/blank lines pass as blank
    lines, a data line with a non-ASCII character is a GraphFormatError. numpy's integer
    parser can crash the interpreter on such tokens (numpy 2.x, astral-plane characters), so
    they never reach it."""
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            s = line.strip()
            if not s or s.startswith(_COMMENTS):
                yield "\n"
                continue
            if not s.isascii():
                bad = next(c for c in s if not c.isascii())
                raise GraphFormatError(path, field, f"line {lineno}: non-ASCII character {bad!r} in {s[:40]!r}")
            yield line


def read_table(path: str, field: str, dtype=np.int64, ncols: int | None = None,
               allow_empty: bool = False) -> np.ndarray:
    """Read a numeric table ``[rows, ncols]`` from a text file (``.gz`` transparently).

    Lines starting with ``#`` or ``%`` and blank lines are skipped; columns are separated by a
    comma (detected on the first data line) or by whitespace. For float tables, ``nan``
    tokens are accepted (callers decide what they mean).

    Raises:
        GraphFormatError: naming ``path`` and ``field`` -- unreadable/corrupt file, wrong column
        count, non-numeric token (with its line number), or an empty table unless allowed.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GraphFormatError(path, field, "file not found")
    try:
        delimiter = _sniff_delimiter(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if _has_non_ascii(path):
                arr = np.loadtxt(_ascii_data_lines(path, field), dtype=dtype, delimiter=delimiter,
                                 comments=list(_COMMENTS), ndmin=2)
            else:
                with _open_text(path) as f:
                    arr = np.loadtxt(f, dtype=dtype, delimiter=delimiter, comments=list(_COMMENTS), ndmin=2)
    except GraphFormatError:
        raise
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise GraphFormatError(path, field, f"cannot read file (truncated or corrupt?): {e}") from e
    except (ValueError, OverflowError) as e:
        try:
            err = _diagnose(path, field, ncols, dtype, delimiter)
        except (OSError, EOFError, zlib.error) as e2:
            raise GraphFormatError(path, field, f"cannot read file (truncated or corrupt?): {e2}") from e
        raise (err or GraphFormatError(path, field, str(e))) from e
    if arr.size == 0:
        if allow_empty:
            return np.zeros((0, ncols or 0), dtype=dtype)
        raise GraphFormatError(path, field, "file contains no data")
    if ncols is not None and arr.shape[1] != ncols:
        raise GraphFormatError(path, field, f"expected {ncols} columns, found {arr.shape[1]}")
    return arr
