"""Imports a run will need later, done on a background thread while the startup phases run.

`torch.optim.Optimizer.__init__` (through `torch._disable_dynamo`) imports `torch._dynamo` the
first time an optimizer is built: 0.8 s on this laptop-class CPU, 3.5 s on the device machine,
all of it on the critical path between the plans and the first epoch (the `model` phase). The
startup phases before it (load, partition, store, data, plan, build) spend their time in numpy,
torch, MPI and CUDA calls that release the GIL, so the import runs beside them instead.

Python's per-module import locks make a concurrent import safe: a thread that needs a module the
other is importing waits for it. While the import runs, the interpreter's switch interval is
0.5 ms instead of 5 ms: each time the main thread gives up the GIL (a CUDA sync, a copy on the
thread pool) it gets it back after at most that long, instead of waiting out the import thread's
full slice (on the device machine the plan phase took 1.6 s beside the import vs 0.46 s alone).
Only `warm_imports()` starts the thread (the CLI does, once, for GPU runs: on the CPU path the
phases are GIL-bound numpy and Python -- reddit-like@0.1 on a 2-core box started 0.1-0.9 s later
with the thread than without); `MGG_NO_WARM_IMPORTS=1` turns it off.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading

__all__ = ["warm_imports", "WARM_MODULES"]

#: modules imported in the background (what the first optimizer construction imports)
WARM_MODULES = ("torch._dynamo",)


#: the switch interval while the background import runs (seconds)
SWITCH_INTERVAL = 0.0005


def _run(names: tuple[str, ...], restore: float) -> None:
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the main thread imports it again and reports
                return
    finally:
        sys.setswitchinterval(restore)


def warm_imports(names: tuple[str, ...] = WARM_MODULES) -> threading.Thread | None:
    """Start importing `names` on a daemon thread; returns it (None when turned off)."""
    if os.environ.get("MGG_NO_WARM_IMPORTS", "") not in ("", "0"):
        return None
    restore = sys.getswitchinterval()
    sys.setswitchinterval(min(restore, SWITCH_INTERVAL))
    t = threading.Thread(target=_run, args=(tuple(names), restore), name="mgg-warm-imports", daemon=True)
    t.start()
    return t
