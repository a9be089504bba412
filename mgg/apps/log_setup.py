"""Where mgg's `logging` lines go in the command-line apps: one stderr handler on the ``mgg``
logger (the tuner's ``mgg.tuner``, the loaders' ``mgg.data``, ...).

Rank 0 shows INFO and above (WARNING with -q, DEBUG with -v); the other ranks show warnings
only, prefixed with their rank, so a P-rank job prints each line once rather than P times.
Installing again replaces the handler (tests, several runs in one process).
"""
from __future__ import annotations

import logging
import sys

__all__ = ["install_log_handler", "HANDLER_NAME"]

HANDLER_NAME = "mgg-cli"


def install_log_handler(verbosity: int = 0, rank: int = 0, size: int = 1, stream=None) -> logging.Handler:
    """Attach the handler to the ``mgg`` logger (its lines then do not also reach the root
    logger's handlers) and set the level from `verbosity` (-1 quiet, 0, >= 1 verbose) and `rank`."""
    log = logging.getLogger("mgg")
    for h in list(log.handlers):
        if h.get_name() == HANDLER_NAME:
            log.removeHandler(h)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(HANDLER_NAME)
    prefix = f"rank {rank} of {size}: " if rank != 0 else ""
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    if rank != 0:
        level = logging.WARNING
    else:
        level = logging.WARNING if verbosity < 0 else (logging.DEBUG if verbosity > 0 else logging.INFO)
    log.setLevel(level)
    log.addHandler(handler)
    log.propagate = False
    return handler
