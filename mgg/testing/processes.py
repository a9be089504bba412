"""What a test needs to launch mgg as a process (`python -m mgg...`, `mpirun ...`): the
environment, the mpirun prefix and the time after which a launched process counts as hung.

A test asserts what the process did, never how fast: PROCESS_TIMEOUT_S is a hang detector only."""
from __future__ import annotations

import os
import subprocess
import sys

from .paths import ROOT

__all__ = ["MPIRUN", "PROCESS_TIMEOUT_S", "subprocess_env", "train_cli"]

#: the `mpirun` prefix of a launched job: oversubscribed, no binding, Open MPI's UCX one-sided
#: component off, and --allow-run-as-root when running as root
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "osc", "^ucx"] + (
    ["--allow-run-as-root"] if os.geteuid() == 0 else [])

#: seconds after which a process a test launches (python -m mgg..., mpirun) is killed. It catches a
#: hang, nothing else: this is many times any launch's time on a loaded 2-core box.
#: tests/run_all.sh bounds each test as well (pytest-timeout).
PROCESS_TIMEOUT_S = 300

#: test hooks a launched process never inherits from the test that launches it
_HOOKS = ("MGG_FAULT_INJECT", "MGG_SERVE_TOKEN", "MGG_TEST_ABORT_ON_FAILURE", "MGG_TEST_FAILURE_LOG")


def subprocess_env(**extra: str) -> dict[str, str]:
    """os.environ with the repository first on PYTHONPATH, Open MPI's UCX one-sided component off,
    no progress bars (CI=true), one OpenMP thread, and no test hooks inherited from the caller
    (MGG_FAULT_INJECT, MGG_SERVE_TOKEN, MGG_TEST_ABORT_ON_FAILURE, MGG_TEST_FAILURE_LOG); `extra`
    is applied last."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(OMPI_MCA_osc="^ucx", CI="true", OMP_NUM_THREADS="1")
    for hook in _HOOKS:
        e.pop(hook, None)
    e.update(extra)
    return e


def train_cli(*args: str, timeout: float = PROCESS_TIMEOUT_S) -> subprocess.CompletedProcess:
    """`python -m mgg.train *args` from the repository root in subprocess_env(): the finished
    process, stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "mgg.train", *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)
