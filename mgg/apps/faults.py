"""Fault injection for the reliability tests (docs/multinode.md): MGG_FAULT_INJECT="RANK:EPOCH[:KIND]".

Rank RANK fails in the middle of epoch EPOCH, after the forward pass and before the backward's
collectives. KIND: raise (default; an exception), exit (os._exit(17), no MPI_Finalize), kill
(SIGKILL, as `kill -9`), sigterm (SIGTERM to itself), sigint (SIGINT to itself, as Ctrl-C), hang
(sleeps; its peers wait in a collective).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from .config import UserError

__all__ = ["FAULT_KINDS", "FaultSpec", "parse_fault", "fault_point"]

FAULT_KINDS = ("raise", "exit", "kill", "sigterm", "sigint", "hang")


@dataclass(frozen=True)
class FaultSpec:
    """Rank `rank` injects `kind` in epoch `epoch`."""

    rank: int
    epoch: int
    kind: str = "raise"


def parse_fault(spec: str | None) -> FaultSpec | None:
    """The fault that MGG_FAULT_INJECT's value `spec` names (None: unset or empty); UserError when
    it is not RANK:EPOCH[:KIND]."""
    if not spec:
        return None
    parts = spec.split(":")
    try:
        rank, epoch = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        rank = epoch = -1
    kind = parts[2] if len(parts) > 2 else "raise"
    if rank < 0 or epoch < 1 or len(parts) > 3 or kind not in FAULT_KINDS:
        raise UserError(f"MGG_FAULT_INJECT={spec!r}: expected RANK:EPOCH[:KIND] with RANK >= 0, "
                        f"EPOCH >= 1 and KIND one of {', '.join(FAULT_KINDS)}")
    return FaultSpec(rank, epoch, kind)


def fault_point(fault: FaultSpec | None, rank: int, epoch: int) -> None:
    """Inject `fault` when this is its rank and epoch (a no-op otherwise)."""
    if fault is None or (fault.rank, fault.epoch) != (rank, epoch):
        return
    kind = fault.kind
    sys.stderr.write(f"mgg.train: MGG_FAULT_INJECT: rank {rank} injects '{kind}' in epoch {epoch}\n")
    sys.stderr.flush()
    if kind == "raise":
        raise RuntimeError(f"injected fault (MGG_FAULT_INJECT) on rank {rank} in epoch {epoch}")
    if kind == "exit":
        os._exit(17)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if kind == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    if kind == "hang":
        while True:
            time.sleep(3600)
