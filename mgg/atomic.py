"""Atomic file writes: readers see the old file or the new one, never a torn one.

Every writer in mgg (graphs, plans, metrics, tuning caches, table snapshots, checkpoints) goes
through `atomic_write`: the data is written to a temporary file in the target's folder, flushed
and fsync'ed, then renamed over the target with `os.replace` (and the folder fsync'ed); on any error the temporary file is
removed and the old file is left untouched. This module imports nothing from mgg.

File modes: the result has the mode a plain ``open(path, "w")`` would give it, not mkstemp's 0600.
A new file gets ``0o666 & ~umask`` (0644 under the usual umask 022); a file that is overwritten
keeps its permission bits (a user who made a metrics file private keeps it private); an explicit
`mode` argument wins over both.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from typing import IO, Any, Callable

__all__ = ["atomic_write", "atomic_write_json", "atomic_path", "fsync_dir", "current_umask", "default_mode"]


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (/proc/self/status);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(path: str) -> int:
    """Permission bits for a file written at `path`: the existing file's when it is overwritten,
    else ``0o666 & ~umask`` (what ``open(path, "w")`` creates)."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    return 0o666 & ~current_umask()


def atomic_path(path: str | os.PathLike, fill: Callable[[str], None], mode: int | None = None,
                before_replace: Callable[[], None] | None = None) -> None:
    """Call ``fill(tmp_path)`` to create a temporary file beside `path`, fsync it, rename it over
    `path`, fsync the folder. For writers that need a path rather than a file object (e.g. numpy
    memmaps). `mode` sets the permission bits (default: see the module docstring, never mkstemp's
    0600). `before_replace` runs after the fsync and right before the rename (checkpoints move
    the current file aside there); if it raises, the temporary file is removed."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    final_mode = default_mode(path) if mode is None else mode
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="-" + os.path.basename(path))
    os.close(fd)
    try:
        fill(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, final_mode)  # last: a read-only mode must not stop the fsync above
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(d)


def fsync_dir(d: str) -> None:
    """fsync a folder so renames in it survive a crash; a no-op where folders cannot be opened."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO], Any], text: bool = False,
                 mode: int | None = None, before_replace: Callable[[], None] | None = None) -> None:
    """Call ``write(fileobj)`` on a temporary file beside `path` (binary, or text with `text`),
    then rename it over `path`. `mode` and `before_replace` as in `atomic_path`."""
    def fill(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") if text else open(tmp, "wb") as f:
            write(f)
            f.flush()

    atomic_path(path, fill, mode, before_replace)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1, sort_keys: bool = False) -> None:
    """Strict JSON (no NaN) written atomically, newline-terminated."""
    def write(f) -> None:
        json.dump(obj, f, indent=indent, sort_keys=sort_keys, allow_nan=False)
        f.write("\n")

    atomic_write(path, write, text=True)
