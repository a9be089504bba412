"""Atomic file writes: readers see the old file or the new one, never a torn one.

Every writer in mgg (graphs, plans, metrics, tuning caches, table snapshots, checkpoints) goes
through `atomic_write`: the data is written to a temporary file in the target's folder, flushed
and fsync'ed, then renamed over the target with `os.replace`; on any error the temporary file is
removed and the old file is left untouched. This module imports nothing from mgg.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import IO, Any, Callable

__all__ = ["atomic_write", "atomic_write_json", "atomic_path"]


def atomic_path(path: str | os.PathLike, fill: Callable[[str], None], mode: int | None = None) -> None:
    """Call ``fill(tmp_path)`` to create a temporary file beside `path`, fsync it, rename it over
    `path`. For writers that need a path rather than a file object (e.g. numpy memmaps)."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="-" + os.path.basename(path))
    os.close(fd)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        fill(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: str | os.PathLike, write: Callable[[IO], Any], text: bool = False,
                 mode: int | None = None) -> None:
    """Call ``write(fileobj)`` on a temporary file beside `path` (binary, or text with `text`),
    then rename it over `path`. `mode` sets the file's permission bits (mkstemp's are 0600)."""
    def fill(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") if text else open(tmp, "wb") as f:
            write(f)
            f.flush()

    atomic_path(path, fill, mode)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1, sort_keys: bool = False) -> None:
    """Strict JSON (no NaN) written atomically, newline-terminated."""
    def write(f) -> None:
        json.dump(obj, f, indent=indent, sort_keys=sort_keys, allow_nan=False)
        f.write("\n")

    atomic_write(path, write, text=True)
