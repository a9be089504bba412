"""Per-epoch run records written as the epochs happen (rank 0): JSON lines and TensorBoard.

``--log-jsonl PATH``: one JSON object a line, flushed at every epoch, so a run killed at any point
leaves every finished epoch on disk::

    {"event": "start", "time": <unix s>, "world_size": P, "config": {...}, "mgg_version": "..."}
    {"event": "epoch", "epoch": 1, "loss": ..., "train_acc": ..., "val_acc": ..., "test_acc": ...,
     "epoch_ms": ..., "elapsed_s": ...}
    ...
    {"event": "end", "epochs": 200}          ("stopped", with "signal", after SIGTERM/SIGUSR1)

The ``config`` of the start line is the one the metrics JSON records; ``--config PATH`` reads it
back (mgg.apps.config_file). A resumed run (``--resume``) appends to the file. Accuracies are
null before the first evaluation; NaN and inf are written as null.

``--tensorboard DIR``: the same scalars (loss, train/val/test accuracy, epoch ms) per epoch
through ``torch.utils.tensorboard.SummaryWriter`` (needs ``pip install tensorboard``), flushed at
every epoch.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from typing import Any

__all__ = ["EpochLog", "open_epoch_log", "tensorboard_problem"]


def tensorboard_problem() -> str | None:
    """Why --tensorboard cannot work here (the package is missing), or None."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return "--tensorboard needs the tensorboard package (pip install tensorboard)"
    return None


class EpochLog:
    """The open JSON-lines file and/or SummaryWriter of one run (rank 0)."""

    def __init__(self, jsonl: str | None, tensorboard: str | None, header: dict, append: bool = False):
        self._t0 = time.time()
        self._file = None
        self._writer = None
        if jsonl:
            d = os.path.dirname(os.path.abspath(jsonl))
            os.makedirs(d, exist_ok=True)
            self._file = open(jsonl, "a" if append else "w", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=tensorboard)
            self._writer.add_text("config", "```\n" + json.dumps(header.get("config", {}), indent=1) + "\n```")
        self._line({"event": "start", "time": self._t0, **header})

    def _line(self, doc: dict) -> None:
        if self._file is None:
            return
        from .report import json_safe

        self._file.write(json.dumps(json_safe(doc), separators=(",", ":")) + "\n")
        self._file.flush()

    def epoch(self, rec: dict, test_acc: float | None) -> None:
        """Record one epoch (`rec`: the loop's epoch record)."""
        doc = {"event": "epoch", **rec, "test_acc": test_acc, "elapsed_s": round(time.time() - self._t0, 3)}
        self._line(doc)
        if self._writer is not None:
            step = int(rec["epoch"])
            for key in ("loss", "train_acc", "val_acc", "test_acc", "epoch_ms"):
                v = doc.get(key)
                if isinstance(v, (int, float)) and v == v:
                    self._writer.add_scalar(key, float(v), step)
            self._writer.flush()

    def close(self, epochs: int, stopped: str = "") -> None:
        """The end line ("end", or "stopped" with the signal) and close the files."""
        self._line({"event": "stopped", "signal": stopped, "epochs": epochs} if stopped
                   else {"event": "end", "epochs": epochs})
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def open_epoch_log(cfg: Any, comm) -> EpochLog | None:
    """The run's EpochLog on rank 0 when --log-jsonl or --tensorboard asks for one, else None."""
    if comm.rank != 0 or not (getattr(cfg, "log_jsonl", None) or getattr(cfg, "tensorboard", None)):
        return None
    from ..version import version

    header = {"world_size": comm.size, "config": asdict(cfg.resolved()), "mgg_version": version()}
    return EpochLog(cfg.log_jsonl, cfg.tensorboard, header, append=bool(cfg.resume))
