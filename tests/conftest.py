"""Shared test helpers and the suite's markers.

Test modules import the helpers (`from tests.conftest import ROOT, subprocess_env`):

- `ROOT`: the repository root (a `Path`).
- `subprocess_env(**extra)`: the environment for a process a test launches.
- `MPIRUN`: the `mpirun` prefix (oversubscribed, no binding, no UCX one-sided, root allowed when root).
- `needs_mpirun`: skip marker for tests that launch `mpirun`.
- `PROCESS_TIMEOUT_S`: the `timeout=` of a process a test launches: a hang detector only.
- fixture `kernel_cache_dir`: the run's one kernel cache (tests that compile CUDA sources share it).
- `MGG_TEST_FAILURE_LOG=PATH`: each failing test's report is appended to PATH (PATH.rankR under
  mpirun) the moment it fails, so a device run stopped by its time limit, before pytest's summary,
  still keeps every failure's message and traceback.
- `MGG_TEST_ABORT_ON_FAILURE=1`: under mpirun with several ranks, the first failing test (after
  its report is logged) aborts every rank (`MPI.COMM_WORLD.Abort`): the other ranks would
  otherwise wait for ever in that test's next collective, until the run's time limit.
  Off by default: a run then reports every failure it reaches.

Markers: `slow` is on every test that launches a process (`python -m mgg...`, `mpirun`) or trains
for seconds, so the fast inner loop is `pytest -m "not slow" tests`; `bash tests/run_all.sh` runs everything.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "osc", "^ucx"] + (
    ["--allow-run-as-root"] if os.geteuid() == 0 else [])

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not on PATH")

#: seconds after which a process a test launches (python -m mgg..., mpirun) is killed. It catches a
#: hang, nothing else: a test asserts what the process did, never how fast, and this is many times
#: any launch's time on a loaded 2-core box. tests/run_all.sh bounds each test as well (pytest-timeout).
PROCESS_TIMEOUT_S = 300

MARKERS = (
    "gpu: needs a CUDA GPU (skipped without one)",
    "mpi: multi-rank test, run under mpirun with --with-mpi",
    "slow: launches a process (python -m mgg..., mpirun) or trains for seconds; deselect with -m 'not slow'",
)


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory) -> Path:
    """One kernel cache for the whole run: every test that builds a CUDA source (nvcc) shares it,
    so each source is compiled once per run (point MGG_KERNEL_CACHE here with monkeypatch)."""
    return tmp_path_factory.mktemp("kernel-cache")


def subprocess_env(**extra: str) -> dict[str, str]:
    """os.environ with the repository first on PYTHONPATH, Open MPI's UCX one-sided component off,
    no progress bars (CI=true), one OpenMP thread, and no test hooks inherited from the caller
    (MGG_FAULT_INJECT, MGG_SERVE_TOKEN, MGG_TEST_ABORT_ON_FAILURE, MGG_TEST_FAILURE_LOG); `extra`
    is applied last."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(OMPI_MCA_osc="^ucx", CI="true", OMP_NUM_THREADS="1")
    for hook in ("MGG_FAULT_INJECT", "MGG_SERVE_TOKEN", "MGG_TEST_ABORT_ON_FAILURE", "MGG_TEST_FAILURE_LOG"):
        e.pop(hook, None)
    e.update(extra)
    return e


def failure_log_path() -> str | None:
    """Where failures are written (MGG_TEST_FAILURE_LOG, with .rankR under mpirun), or None."""
    path = os.environ.get("MGG_TEST_FAILURE_LOG")
    if not path:
        return None
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK")
    return f"{path}.rank{rank}" if rank is not None else path


def _mpi_world_size() -> int:
    """Ranks of the mpirun job this process belongs to (1 outside one)."""
    for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 1


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append a failed report (setup, call or teardown) to the failure log, flushed at once; with
    MGG_TEST_ABORT_ON_FAILURE under a multi-rank mpirun, then abort every rank."""
    if not report.failed:
        return
    path = failure_log_path()
    if path is not None:
        with open(path, "a") as f:
            f.write(f"=== FAILED {report.nodeid} ({report.when}, {report.duration:.2f} s)\n{report.longreprtext}\n\n")
            f.flush()
    if os.environ.get("MGG_TEST_ABORT_ON_FAILURE", "0") not in ("", "0") and _mpi_world_size() > 1:
        import sys

        from mpi4py import MPI

        sys.stdout.flush()
        sys.stderr.write(f"\nMGG_TEST_ABORT_ON_FAILURE: {report.nodeid} failed ({report.when}) on rank "
                         f"{MPI.COMM_WORLD.Get_rank()}; aborting every rank\n{report.longreprtext}\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    _nul_free_mpi_banner(config)


def _nul_free_mpi_banner(config: pytest.Config) -> None:
    """Keep multi-rank test logs text: pytest-mpi's "MPI Information" summary (printed by every
    rank under --with-mpi) writes MPI_Get_library_version() verbatim, and Open MPI's string ends
    in a NUL byte, which makes `grep` call the whole log binary."""
    try:
        with_mpi = config.getoption("--with-mpi")
    except ValueError:  # pytest-mpi not installed
        return
    if not with_mpi:
        return
    from mpi4py import MPI

    library_version = MPI.Get_library_version
    if getattr(library_version, "_mgg_nul_free", False):
        return

    def nul_free() -> str:
        return library_version().replace("\x00", "").rstrip()

    nul_free._mgg_nul_free = True
    MPI.Get_library_version = nul_free


@pytest.fixture(autouse=True)
def _mgg_logger_restored():
    """The CLIs install a handler on the ``mgg`` logger (and stop its propagation); each test gets
    the logger as it found it, so a later test's caplog still sees mgg's lines."""
    import logging

    log = logging.getLogger("mgg")
    saved = (list(log.handlers), log.propagate, log.level)
    yield
    log.handlers[:] = saved[0]
    log.propagate, log.level = saved[1], saved[2]
