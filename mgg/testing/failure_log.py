"""The test suite's failure log: each failing test's report appended to MGG_TEST_FAILURE_LOG
(PATH, or PATH.rankR under mpirun) the moment it fails, so a run stopped by its time limit before
pytest's summary still keeps every failure's message and traceback. With
MGG_TEST_ABORT_ON_FAILURE=1 under a multi-rank mpirun, the first failure then aborts every rank
(`MPI.COMM_WORLD.Abort`): the other ranks would otherwise wait for ever in that test's next
collective.

tests/conftest.py calls `log_failed_report` from its `pytest_runtest_logreport` hook; a conftest
elsewhere can take the hook as it is:
`from mgg.testing.failure_log import log_failed_report as pytest_runtest_logreport`."""
from __future__ import annotations

import os
import sys

__all__ = ["failure_log_path", "mpi_world_size", "log_failed_report"]


def failure_log_path() -> str | None:
    """Where failures are written (MGG_TEST_FAILURE_LOG, with .rankR under mpirun), or None."""
    path = os.environ.get("MGG_TEST_FAILURE_LOG")
    if not path:
        return None
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK")
    return f"{path}.rank{rank}" if rank is not None else path


def mpi_world_size() -> int:
    """Ranks of the mpirun job this process belongs to (1 outside one)."""
    for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 1


def log_failed_report(report) -> None:
    """Append a failed `pytest.TestReport` (setup, call or teardown) to the failure log, flushed
    at once; with MGG_TEST_ABORT_ON_FAILURE under a multi-rank mpirun, then abort every rank.
    Passing reports write nothing."""
    if not report.failed:
        return
    path = failure_log_path()
    if path is not None:
        with open(path, "a") as f:
            f.write(f"=== FAILED {report.nodeid} ({report.when}, {report.duration:.2f} s)\n{report.longreprtext}\n\n")
            f.flush()
    if os.environ.get("MGG_TEST_ABORT_ON_FAILURE", "0") not in ("", "0") and mpi_world_size() > 1:
        from mpi4py import MPI

        sys.stdout.flush()
        sys.stderr.write(f"\nMGG_TEST_ABORT_ON_FAILURE: {report.nodeid} failed ({report.when}) on rank "
                         f"{MPI.COMM_WORLD.Get_rank()}; aborting every rank\n{report.longreprtext}\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
