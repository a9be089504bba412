"""The suite's fixtures, hooks and markers. Shared helpers live in mgg.testing and are imported
from there (`from mgg.testing.processes import subprocess_env`); this file holds only what pytest
finds by itself:

- fixture `kernel_cache_dir`: the run's one kernel cache (tests that compile CUDA sources share it).
- marker `needs_mpirun`: the test launches `mpirun`; skipped when it is not on PATH.
- `MGG_TEST_FAILURE_LOG=PATH`: each failing test's report is appended to PATH (PATH.rankR under
  mpirun) the moment it fails, so a device run stopped by its time limit, before pytest's summary,
  still keeps every failure's message and traceback (mgg.testing.failure_log).
- `MGG_TEST_ABORT_ON_FAILURE=1`: under mpirun with several ranks, the first failing test (after
  its report is logged) aborts every rank (`MPI.COMM_WORLD.Abort`): the other ranks would
  otherwise wait for ever in that test's next collective, until the run's time limit.
  Off by default: a run then reports every failure it reaches.
- under mpirun each rank works on its own GPU (local rank modulo the GPUs seen) from collection
  on, as `mgg.train` and the NVSHMEM store do: GPU test modules that fix their device at import
  (`DEV = torch.device("cuda", torch.cuda.current_device())`) then use the rank's GPU.

Markers: `slow` is on every test that launches a process (`python -m mgg...`, `mpirun`) or trains
for seconds, so the fast inner loop is `pytest -m "not slow" tests`; `mpi` on every multi-rank test
(run under mpirun with `--with-mpi -m mpi`; skipped otherwise); `gpu` on every test that needs a
CUDA GPU (skipped without one). `bash tests/run_all.sh` runs everything.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mgg.testing.failure_log import log_failed_report

MARKERS = (
    "gpu: needs a CUDA GPU (skipped without one)",
    "mpi: multi-rank test, run under mpirun with --with-mpi",
    "slow: launches a process (python -m mgg..., mpirun) or trains for seconds; deselect with -m 'not slow'",
    "needs_mpirun: launches mpirun (skipped when mpirun is not on PATH)",
)


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory) -> Path:
    """One kernel cache for the whole run: every test that builds a CUDA source (nvcc) shares it,
    so each source is compiled once per run (point MGG_KERNEL_CACHE here with monkeypatch)."""
    return tmp_path_factory.mktemp("kernel-cache")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Log a failed report (mgg.testing.failure_log); abort every rank when asked to."""
    log_failed_report(report)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test marked `needs_mpirun` when `mpirun` is not on PATH."""
    if item.get_closest_marker("needs_mpirun") is not None and shutil.which("mpirun") is None:
        pytest.skip("mpirun not on PATH")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    _nul_free_mpi_banner(config)
    _bind_rank_gpu()


def _bind_rank_gpu() -> None:
    """Under mpirun (or a Slurm step), make the rank's GPU current: local rank modulo the GPUs
    seen (mgg.runtime.gpu_assignment.device_index). Nothing without a local rank or a GPU."""
    local_rank = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    if local_rank is None:
        return
    import torch

    if torch.cuda.is_available():
        from mgg.runtime.gpu_assignment import device_index

        torch.cuda.set_device(device_index(int(local_rank), torch.cuda.device_count()))


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
