"""The files a training run writes at its end, checked before it starts: `check_outputs`.

Rank 0 writes the metrics JSON (--metrics-json), the checkpoints (--checkpoint-dir) and the tuning
log (--tune-log), each atomically (mgg.atomic: a temporary file beside the target, then a rename).
A path that cannot take such a write would otherwise be found only after every epoch ran. Rank 0
creates the folders (as the write would) and a temporary file in each, removed at once; the
problem is broadcast, so every rank stops with the same one-line error before any work.
"""
from __future__ import annotations

import os
import tempfile

from .config import TrainConfig, UserError

__all__ = ["output_problem", "check_outputs"]


def _probe_folder(folder: str) -> None:
    """Create `folder` (and its parents) and a temporary file in it, then remove the file;
    OSError when the folder cannot be made or written into."""
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-write-test")
    os.close(fd)
    os.unlink(tmp)


def _reason(e: OSError) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return f"{e.strerror or type(e).__name__}{where}"


def output_problem(flag: str, path: str, folder: bool) -> str:
    """"" when `path` can be written as `flag` writes it (a file replaced atomically, or a folder
    files are written into), else a one-line reason naming the flag and the path."""
    target = os.path.abspath(os.path.expanduser(path))
    if folder:
        if os.path.exists(target) and not os.path.isdir(target):
            return f"{flag} {path}: exists and is not a folder"
        where = target
    else:
        if os.path.isdir(target):
            return f"{flag} {path}: is a folder; give a file name"
        where = os.path.dirname(target)
    existing = where
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):  # a file where a folder must be
        return f"{flag} {path}: cannot write into {where}: {existing} is not a folder"
    try:
        _probe_folder(where)
    except OSError as e:
        return f"{flag} {path}: cannot write into {where}: {_reason(e)}"
    return ""


def check_outputs(cfg: TrainConfig, comm) -> None:
    """UserError on every rank when rank 0 cannot write --metrics-json, --checkpoint-dir or
    --tune-log. Collective (one broadcast); before the dataset is loaded."""
    wanted = [(flag, p, folder) for flag, p, folder in (("--metrics-json", cfg.metrics_json, False),
                                                        ("--checkpoint-dir", cfg.checkpoint_dir, True),
                                                        ("--tune-log", cfg.tune_log, False)) if p]
    if not wanted:
        return
    problem = ""
    if comm.rank == 0:
        problem = next((p for p in (output_problem(*w) for w in wanted) if p), "")
    if comm.size > 1:
        problem = comm.bcast(problem)
    if problem:
        raise UserError(problem)
