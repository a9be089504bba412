"""Atomic file writes: readers see the old file or the new one, never a torn one.

Every writer in mgg (graphs, plans, metrics, tuning caches, table snapshots, checkpoints) goes
through `atomic_write`: the data is written to a temporary file in the target's folder, flushed
and fsync'ed, then renamed over the target with `os.replace` (and the folder fsync'ed); on any error the temporary file is
removed and the old file is left untouched. This module imports nothing from mgg.

Temporary files are named ``.tmp-<random>-<target's name>`` and locked (``flock``, exclusive) by
their writer until it is done. A writer that dies mid-write (a crash, SIGKILL, a preempted job)
leaves its temporary file behind, unlocked: `remove_stale_temporaries` removes those of one target
and leaves any a live process still holds, whichever process or host that is, as far as the file
system implements ``flock`` (local file systems and NFS do; where it is missing nothing is removed).

File modes: the result has the mode a plain ``open(path, "w")`` would give it, not mkstemp's 0600.
A new file gets ``0o666 & ~umask`` (0644 under the usual umask 022); a file that is overwritten
keeps its permission bits (a user who made a metrics file private keeps it private); an explicit
`mode` argument wins over both.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from typing import IO, Any, Callable

try:
    import fcntl
except ImportError:  # not POSIX: no locks, and no stale file is ever removed
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_write", "atomic_write_json", "atomic_path", "fsync_dir", "current_umask", "default_mode",
           "remove_stale_temporaries", "TMP_PREFIX"]

#: temporary files are named TMP_PREFIX + <random> + "-" + <the target's name>
TMP_PREFIX = ".tmp-"


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
    lock_fd, tmp = _locked_temporary(d, os.path.basename(path))
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
    finally:
        os.close(lock_fd)  # releases the lock
    fsync_dir(d)


def _try_lock(fd: int, wait: bool) -> bool | None:
    """flock(fd, exclusive): True when taken, False when another open file holds it (only without
    `wait`), None when the file system offers no locks."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        return None


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        st, fst = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _locked_temporary(folder: str, name: str) -> tuple[int, str]:
    """(fd, path) of a new temporary file for target `name` in `folder`, locked through fd. A
    cleaner that took the lock between the file's creation and ours removed it: make another."""
    while True:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX, suffix="-" + name)
        _try_lock(fd, wait=True)
        if _same_file(fd, tmp):
            return fd, tmp
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files that interrupted atomic writes of `path` left beside it
    (``.tmp-*-<name>``, regular files whose lock no process holds); returns their paths. A file a
    live writer holds, or any file where the file system offers no locks, is left alone."""
    path = os.fspath(path)
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for entry in entries:
        if not (entry.startswith(TMP_PREFIX) and entry.endswith("-" + name)) or entry == TMP_PREFIX + name:
            continue
        tmp = os.path.join(folder, entry)
        try:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:  # gone already, a symbolic link, or unreadable: not ours to remove
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or _try_lock(fd, wait=False) is not True:
                continue
            if _same_file(fd, tmp):  # still the file we locked (its writer may have renamed it)
                os.unlink(tmp)
                removed.append(tmp)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


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
