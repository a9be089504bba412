"""How the training command ends when it cannot run: one message, once, and the same exit status on
every rank (an argparse error, a UserError, a launch mgg cannot use)."""
from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["exit_together", "only_first_rank_prints", "report_user_error"]


def exit_together(code) -> None:
    """Exit with `code` after every rank got here (a bad flag is bad on all of them): without the
    barrier the launcher would kill the first rank before it prints the error."""
    sys.stderr.flush()
    from ..runtime.launch_env import mpi_launch_size

    if (mpi_launch_size() or 1) > 1:
        try:
            from ..runtime.comm import mpi_env_defaults

            mpi_env_defaults()
            from mpi4py import MPI

            MPI.COMM_WORLD.Barrier()
        except (ImportError, RuntimeError):  # no mpi4py, or no MPI library: nothing to wait for
            pass
    sys.exit(code)


@contextlib.contextmanager
def only_first_rank_prints(first: bool):
    """stdout and stderr go nowhere inside the block unless this is the launch's first rank: every
    rank parses the same flags, so one copy of an argparse error (or of --help) is enough."""
    if first:
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        yield


def report_user_error(comm, control, message: str, wait_s: float = 15.0) -> None:
    """Print a UserError once and exit 2 on every rank.

    Most user errors are raised on every rank at once: the checks read the same flags, or agree
    through `comm.check`, which puts the failing rank's message into every rank's error. Then rank 0
    prints "error: <message>" and every rank exits 2. A rank that fails alone -- no other rank
    reaches this point within `wait_s` seconds, found through a nonblocking barrier on `control`, a
    communicator kept for this -- prints "error (rank R of P): <message>" itself, and its exit ends
    the job.
    """
    import time

    if comm.size == 1 or control is None:
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
        sys.exit(2)
    request = control.Ibarrier()
    deadline = time.monotonic() + wait_s
    while not request.Test():
        if time.monotonic() > deadline:
            sys.stderr.write(f"error (rank {comm.rank} of {comm.size}): {message}\n")
            sys.stderr.flush()
            sys.exit(2)
        time.sleep(0.01)
    if comm.rank == 0:  # an error agreed through comm.check carries the failing rank's message
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
    control.Barrier()  # rank 0 has printed before any rank's exit status reaches the launcher
    sys.exit(2)
