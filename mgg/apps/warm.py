"""Imports a run will need later, done on a background thread while the startup phases run.

`torch.optim.Optimizer.__init__` (through `torch._disable_dynamo`) imports `torch._dynamo` the
first time an optimizer is built: 0.8 s on this laptop-class CPU, 3.5 s on the device machine,
all of it on the critical path between the plans and the first epoch (the `model` phase). The
startup phases before it (load, partition, store, data, plan, build) spend their time in numpy,
torch, MPI and CUDA calls that release the GIL, so the import runs beside them instead.

Python's per-module import locks make a concurrent import safe: a thread that needs a module the
other is importing waits for it. Only `warm_imports()` starts the thread (the CLI does, once);
`MGG_NO_WARM_IMPORTS=1` turns it off.
"""
from __future__ import annotations

import importlib
import os
import threading

__all__ = ["warm_imports", "WARM_MODULES"]

#: modules imported in the background (what the first optimizer construction imports)
WARM_MODULES = ("torch._dynamo",)


def _run(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the main thread imports it again and reports
            return


def warm_imports(names: tuple[str, ...] = WARM_MODULES) -> threading.Thread | None:
    """Start importing `names` on a daemon thread; returns it (None when turned off)."""
    if os.environ.get("MGG_NO_WARM_IMPORTS", "") not in ("", "0"):
        return None
    t = threading.Thread(target=_run, args=(tuple(names),), name="mgg-warm-imports", daemon=True)
    t.start()
    return t
