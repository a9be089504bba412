"""The communicator context: the one piece of process-wide state mgg keeps.

`Communicator` wraps an mpi4py communicator (or stands in for a single process when MPI is not
wanted) and adds what the runtime needs on top: node-local rank, collective error agreement and
`abort_on_error`, which turns an exception on any rank into an `MPI_Abort` of the whole job with
that rank's message instead of leaving the other ranks hung in a collective.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ContextManager, Iterator

import numpy as np

from .launch_env import MPI_INSTALL_HINT, LaunchError, launch_problem, launch_rank, mpi_problem
from .watchdog import Watchdog

__all__ = ["Communicator", "world", "abort_on_error", "RankError", "LaunchError", "mpi_env_defaults", "import_mpi",
           "singleton_transports", "SINGLETON_MCA"]


class RankError(RuntimeError):
    """Raised on every rank when some rank reported a failure through `Communicator.check`."""


def mpi_env_defaults() -> None:
    """Environment defaults every mgg entry point sets before MPI starts (before the first
    `import mpi4py.MPI`, which calls MPI_Init); a value the user or the launcher set wins.

    OMPI_MCA_osc=^ucx: on hosts without UCX transports Open MPI 5's UCX one-sided component
    prints "Error: OSC UCX component priority set inside component query failed" on every rank
    and falls back; the RDMA/shared-memory components serve mgg's MPI windows. Other MPIs
    ignore the variable."""
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")


#: Open MPI's transports for a process no launcher started (a singleton: it only ever talks to
#: itself): MPI_Init skips probing the network and GPU transports, about 1 s on Open MPI 4.1 and 5
SINGLETON_MCA = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self"}


@contextmanager
def singleton_transports(env=None) -> Iterator[None]:
    """Inside the block, a process that no MPI launcher started gets `SINGLETON_MCA` (each where
    the user set no value), so an MPI_Init inside it starts fast; the variables are removed again
    afterwards, so the processes it launches later (an mpirun of its own) do not inherit them."""
    from .launch_env import mpi_launched

    env = os.environ if env is None else env
    added = [] if mpi_launched(env) else [k for k in SINGLETON_MCA if k not in env]
    for k in added:
        env[k] = SINGLETON_MCA[k]
    try:
        yield
    finally:
        for k in added:
            env.pop(k, None)


def import_mpi():
    """mpi4py.MPI, initialising MPI on the first call with mgg's environment defaults
    (`mpi_env_defaults`, and `singleton_transports` for a process no launcher started)."""
    mpi_env_defaults()
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    with singleton_transports():
        from mpi4py import MPI  # imported lazily: the data layer and tests need no MPI
    return MPI


def _mpi():
    return import_mpi()


@dataclass
class Communicator:
    """An MPI communicator with the few collectives mgg uses.

    Attributes:
        comm: the mpi4py communicator, or None for a single process without MPI.
        ranks_per_node: override of the node grouping (simulates several nodes on one machine).
    """

    comm: Any = None
    ranks_per_node: int | None = None
    watchdog: Watchdog | None = field(default=None, repr=False)
    _node_comm: Any = field(default=None, repr=False)

    def start_watchdog(self, timeout_s: float) -> Watchdog:
        """Abort the job when any collective of this communicator takes longer than timeout_s."""
        if self.watchdog is not None:
            self.watchdog.close()
        self.watchdog = Watchdog(timeout_s, rank=self.rank)
        return self.watchdog

    def guard(self, phase: str) -> ContextManager[None]:
        """Arm the watchdog (if any) around a collective phase."""
        return nullcontext() if self.watchdog is None else self.watchdog.phase(phase)

    # -- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return 0 if self.comm is None else self.comm.Get_rank()

    @property
    def size(self) -> int:
        return 1 if self.comm is None else self.comm.Get_size()

    @property
    def local_rank(self) -> int:
        """Rank within this node (selects the GPU)."""
        if self.comm is None:
            return 0
        if self.ranks_per_node:
            return self.rank % self.ranks_per_node
        if self._node_comm is None:
            MPI = _mpi()
            self._node_comm = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        return self._node_comm.Get_rank()

    def node_of_ranks(self) -> "np.ndarray":
        """int32 [size]: node index of every rank (collective).

        Ranks sharing memory (MPI_COMM_TYPE_SHARED) form a node, numbered in order of their lowest
        rank; `ranks_per_node` (or MGG_RANKS_PER_NODE) overrides this, so that `mpirun -np 4` on one
        machine can simulate 2 nodes x 2 ranks.
        """
        if self.comm is None:
            return np.zeros(1, dtype=np.int32)
        if self.ranks_per_node:
            return (np.arange(self.size) // self.ranks_per_node).astype(np.int32)
        self.local_rank  # creates the node communicator
        leader = self._node_comm.allreduce(self.rank, op=_mpi().MIN)
        leaders = np.asarray(self.allgather(leader))
        return np.unique(leaders, return_inverse=True)[1].astype(np.int32)

    # -- collectives ----------------------------------------------------------------------
    def barrier(self) -> None:
        if self.comm is not None:
            with self.guard("barrier"):
                self.comm.Barrier()

    def allreduce_(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        """In-place all-reduce ("sum", "max" or "min") of a contiguous numpy array; returns it."""
        if self.comm is not None and self.size > 1:
            MPI = _mpi()
            with self.guard("allreduce"):
                self.comm.Allreduce(MPI.IN_PLACE, buf, op={"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op])
        return buf

    def allreduce_scalar(self, value: float, op: str = "sum") -> float:
        if self.comm is None or self.size == 1:
            return value
        MPI = _mpi()
        ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        with self.guard("allreduce"):
            return self.comm.allreduce(value, op=ops[op])

    def alltoallv(self, send: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Personalised all-to-all of int64 values (collective).

        Args:
            send: int64 [sum(counts)], the values for rank 0, then rank 1, ... (contiguous blocks).
            counts: int64 [size], how many values go to each rank.
        Returns:
            (recv int64 [sum(recv_counts)] -- rank 0's block first, then rank 1's, ... --,
            recv_counts int64 [size]).
        """
        send = np.ascontiguousarray(send, dtype=np.int64)
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        if len(counts) != self.size or int(counts.sum()) != len(send):
            raise ValueError(f"alltoallv: counts must have {self.size} entries summing to len(send)={len(send)}")
        if self.comm is None or self.size == 1:
            return send.copy(), counts.copy()
        MPI = _mpi()
        recv_counts = np.empty(self.size, dtype=np.int64)
        with self.guard("alltoallv"):
            self.comm.Alltoall(counts, recv_counts)
            recv = np.empty(int(recv_counts.sum()), dtype=np.int64)
            # counts and displacements are C ints: move blocks of at most 2**31 - 1 values per round
            limit = (1 << 31) - 1
            sd, rd = np.concatenate([[0], np.cumsum(counts)]), np.concatenate([[0], np.cumsum(recv_counts)])
            done_s, done_r = np.zeros(self.size, np.int64), np.zeros(self.size, np.int64)
            while True:
                sc = np.minimum(counts - done_s, limit // self.size)
                rc = np.minimum(recv_counts - done_r, limit // self.size)
                more = self.comm.allreduce(int(sc.sum() + rc.sum()) > 0, op=MPI.LOR)
                if not more:
                    break
                sbuf = np.concatenate([send[sd[k] + done_s[k]: sd[k] + done_s[k] + sc[k]] for k in range(self.size)])
                rbuf = np.empty(int(rc.sum()), dtype=np.int64)
                sdisp = np.concatenate([[0], np.cumsum(sc)[:-1]])
                rdisp = np.concatenate([[0], np.cumsum(rc)[:-1]])
                self.comm.Alltoallv([sbuf, (sc.astype(np.int32), sdisp.astype(np.int32)), MPI.INT64_T],
                                    [rbuf, (rc.astype(np.int32), rdisp.astype(np.int32)), MPI.INT64_T])
                for k in range(self.size):
                    recv[rd[k] + done_r[k]: rd[k] + done_r[k] + rc[k]] = rbuf[rdisp[k]: rdisp[k] + rc[k]]
                done_s += sc
                done_r += rc
        return recv, recv_counts

    def bcast(self, obj: Any, root: int = 0) -> Any:
        if self.comm is None:
            return obj
        with self.guard("bcast"):
            return self.comm.bcast(obj, root=root)

    def allgather(self, obj: Any) -> list:
        if self.comm is None:
            return [obj]
        with self.guard("allgather"):
            return self.comm.allgather(obj)

    def check(self, error: BaseException | None) -> None:
        """Collective error agreement: every rank calls this; if any rank passes an error, all raise.

        Use around a phase where a rank may fail on its own (loading a file, validating a plan):
        the failing rank's message reaches every rank, so all exit with the same clear error
        instead of some waiting forever in the next collective.
        """
        msg = None if error is None else f"rank {self.rank}: {type(error).__name__}: {error}"
        msgs = [m for m in self.allgather(msg) if m]
        if msgs:
            if error is not None:
                raise error
            raise RankError("; ".join(msgs))

    def abort(self, message: str, code: int = 1) -> None:
        """Print `message` to stderr and end the whole job (all ranks)."""
        sys.stderr.write(message if message.endswith("\n") else message + "\n")
        sys.stderr.flush()
        if self.comm is not None and self.size > 1:
            self.comm.Abort(code)
        os._exit(code)


_WORLD: Communicator | None = None
_WORLD_LOCK = threading.Lock()


def world(use_mpi: bool | None = None, program: str = "mgg", check_launch: bool = True) -> Communicator:
    """The world communicator (created once). `use_mpi=False` forces a single process without MPI.

    With `use_mpi=None`, MPI is used when mpi4py imports and finds an MPI library; a program
    started without a launcher then simply runs as one rank, with or without MPI. A launch that
    would run several independent one-rank jobs instead of one job raises LaunchError (one line
    naming the command or package to use; mgg.runtime.launch_env): torchrun, srun without an MPI
    plugin, an MPI launcher whose ranks find no MPI (or another MPI than the launcher's).
    `program` (the module the user ran) goes into those messages; `check_launch=False` skips these
    checks (mgg.doctor reports them instead).
    """
    global _WORLD
    with _WORLD_LOCK:
        if _WORLD is None:
            comm = None
            if use_mpi is not False:
                problem = launch_problem(program) if check_launch else None
                if problem:
                    raise LaunchError(problem, first=launch_rank() == 0)
                error: BaseException | None = None
                try:
                    comm = _mpi().COMM_WORLD
                except (ImportError, RuntimeError) as e:  # no mpi4py, or no MPI library for it to load
                    if use_mpi:
                        raise LaunchError(f"MPI does not start ({type(e).__name__}: {str(e).splitlines()[0]}): "
                                          f"{MPI_INSTALL_HINT}") from e
                    error = e
                problem = mpi_problem(None if comm is None else comm.Get_size(), error) if check_launch else None
                if problem:
                    raise LaunchError(problem, first=launch_rank() == 0)
            rpn = os.environ.get("MGG_RANKS_PER_NODE")
            _WORLD = Communicator(comm=comm, ranks_per_node=int(rpn) if rpn else None)
        return _WORLD


@contextmanager
def abort_on_error(comm: Communicator, what: str = "mgg") -> Iterator[None]:
    """Run a block; an uncaught exception on this rank aborts the whole MPI job with its message.

    `SystemExit(0)` passes through. Any other exception prints
    ``"<what>: rank R of P failed: <Type>: <message>"`` plus the traceback on stderr and calls
    `MPI_Abort`, so the other ranks do not hang in a collective waiting for this one.
    """
    try:
        yield
    except SystemExit as e:
        if e.code in (0, None):
            raise
        if comm.size == 1:
            raise
        comm.abort(f"{what}: rank {comm.rank} of {comm.size} exited: {e.code}", 2)
    except KeyboardInterrupt:
        comm.abort(f"{what}: rank {comm.rank} of {comm.size} interrupted", 130)
    except BaseException as e:  # noqa: BLE001 - the point is to catch everything
        tb = traceback.format_exc()
        if comm.size == 1:
            raise
        comm.abort(f"{tb}\n{what}: rank {comm.rank} of {comm.size} failed: {type(e).__name__}: {e}", 1)
