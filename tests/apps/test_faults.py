"""Fault handling of mgg.train under `mpirun -np 2|4` (subprocesses with timeouts).

A failure on one rank -- an exception, a process that exits or is killed (`kill -9`), a rank that
hangs -- must end the whole job non-zero with a message naming the rank, through the path meant for
it (abort_on_error, Open MPI's report of a dead rank, the watchdog): a test asserts which, never how
fast, and a job that does not end is caught by the launch's timeout. SIGTERM on one rank (or to
mpirun) stops every rank after a checkpoint, and the resumed run continues the uninterrupted loss
curve. `MGG_FAULT_INJECT=RANK:EPOCH[:KIND]` is train.py's test hook.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from mgg.checkpoint import LAST, read_checkpoint
from mgg.data import load_dataset
from mgg.runtime import Communicator
from mgg.testing.terminal import InTerminal
from mgg.train import TrainConfig, train

from mgg.testing.paths import ROOT
from mgg.testing.processes import PROCESS_TIMEOUT_S, subprocess_env as env

pytestmark = pytest.mark.needs_mpirun


def mpirun(np_, *args, fault=None, timeout=PROCESS_TIMEOUT_S):
    extra = {"MGG_FAULT_INJECT": fault} if fault else {}
    return subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", str(np_), "--backend", "cpu",
                           *args], cwd=ROOT, env=env(**extra), capture_output=True, text=True,
                          timeout=timeout, errors="replace")


def losses_of(path):
    return np.array([e["loss"] for e in json.loads(Path(path).read_text())["epochs"]])


@pytest.mark.slow
def test_exception_on_one_rank_aborts_the_job_with_its_message():
    r = mpirun(2, "--epochs", "20", "--watchdog-timeout", "120", fault="1:3:raise")
    assert r.returncode != 0 and "train_acc=" not in r.stdout  # the job ended in epoch 3
    assert "mgg.train: rank 1 of 2 failed: RuntimeError: injected fault" in r.stderr, r.stderr
    assert "watchdog" not in r.stderr  # abort_on_error ended it, not the watchdog


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kill", "exit"])
def test_dead_rank_ends_the_job_naming_it(kind):
    """kill: SIGKILL of rank 1 (as `kill -9`); exit: os._exit without MPI_Finalize."""
    r = mpirun(2, "--epochs", "20", "--watchdog-timeout", "120", fault=f"1:3:{kind}")
    assert r.returncode != 0 and "train_acc=" not in r.stdout, (r.returncode, r.stdout)
    launcher = r.stderr.replace("rank 1 injects", "")  # Open MPI's own report must name rank 1
    assert re.search(r"rank 1 with PID|@\d+,1\]|watchdog: rank 0", launcher), r.stderr


@pytest.mark.slow
def test_hung_rank_trips_the_watchdog():
    r = mpirun(2, "--epochs", "20", "--watchdog-timeout", "3", fault="1:3:hang")
    assert r.returncode != 0 and "train_acc=" not in r.stdout
    assert re.search(r"mgg watchdog: rank 0 waited \d+\.\d s in '\w+' \(timeout 3 s\)", r.stderr), r.stderr


@pytest.mark.slow
def test_sigterm_on_one_rank_checkpoints_and_resume_continues(tmp_path):
    ck = tmp_path / "ck"
    r = mpirun(2, "--epochs", "8", "--checkpoint-dir", str(ck), fault="1:3:sigterm")
    assert r.returncode == 143, r.stderr
    assert "SIGTERM received: stopped after epoch 3 of 8" in r.stderr
    s = read_checkpoint(ck / LAST)
    assert s["epoch"] == 3 and s["world_size"] == 2 and s["reason"] == "SIGTERM"
    r = mpirun(2, "--epochs", "8", "--checkpoint-dir", str(ck), "--resume", "auto",
               "--metrics-json", str(tmp_path / "resumed.json"))
    assert r.returncode == 0, r.stderr
    # the uninterrupted run: 2 ranks reproduce 1 rank (in process here, to save a launch) to float
    # rounding; tests/apps/test_multinode_mpi.py compares P-rank resume with P-rank straight to 1e-6
    straight = train(TrainConfig(epochs=8, backend="cpu", progress=False), Communicator(comm=None),
                     load_dataset("default"))
    np.testing.assert_allclose(losses_of(tmp_path / "resumed.json"), [e["loss"] for e in straight.epochs],
                               rtol=0, atol=1e-6)


@pytest.mark.slow
def test_sigterm_to_mpirun_stops_the_ranks_after_a_checkpoint(tmp_path):
    """SIGTERM to launch/mpirun.sh (the launcher a user or supervisor kills): every rank stops after
    a checkpoint, rank 0 says so and the job exits 143, as the README promises."""
    ck = tmp_path / "ck"
    cmd = ["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--backend", "cpu", "--dataset", "sbm",
           "--scale", "0.1", "--epochs", "100000", "--checkpoint-dir", str(ck), "--checkpoint-every", "20"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT_S  # a hang detector, not a speed limit
        while not (ck / LAST).exists():
            assert p.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.1)
        os.kill(p.pid, signal.SIGTERM)  # the wrapper, which forwards it to mpirun as SIGUSR2
        _, err = p.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode != 0
    assert p.returncode == 143, err.decode(errors="replace")
    s = read_checkpoint(ck / LAST)
    assert s["reason"] == "SIGTERM" and 20 <= s["epoch"] < 100000
    assert f"mgg.train: SIGTERM received: stopped after epoch {s['epoch']} of 100000" in err.decode()


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_the_ranks_after_a_checkpoint(tmp_path):
    """Ctrl-C typed into the terminal of launch/mpirun.sh (SIGINT to the terminal's foreground
    process group, not a signal picked for one process): the ranks stop after a checkpoint as on
    SIGTERM, rank 0 says how to resume and the launcher exits 130, as its --help says."""
    ck = tmp_path / "ck"
    cmd = ["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--backend", "cpu", "--dataset", "sbm",
           "--scale", "0.1", "--epochs", "100000", "--checkpoint-dir", str(ck), "--checkpoint-every", "20"]
    with InTerminal(cmd, tmp_path / "out", cwd=ROOT, env=env()) as term:
        while not (ck / LAST).exists():
            assert term.proc.poll() is None, term.stderr
            time.sleep(0.1)
        term.ctrl_c()
        code = term.wait(timeout=PROCESS_TIMEOUT_S)
        err = term.stderr
    assert code == 130, err
    s = read_checkpoint(ck / LAST)
    assert s["reason"] == "SIGTERM" and 20 <= s["epoch"] < 100000  # the ranks read the launcher's stop
    assert "launch/mpirun.sh: SIGINT received: every rank stops after its current epoch" in err
    assert (f"mgg.train: SIGTERM received: stopped after epoch {s['epoch']} of 100000; checkpoint {ck / LAST} "
            f"written at epoch {s['epoch']}; continue with --resume auto") in err, err


@pytest.mark.slow
def test_sigint_on_one_rank_stops_every_rank_naming_it(tmp_path):
    """SIGINT on rank 1 only: both ranks stop after epoch 3, agree on the signal's name (the
    checkpoint's reason, rank 0's line) and exit 130."""
    ck = tmp_path / "ck"
    r = mpirun(2, "--epochs", "8", "--checkpoint-dir", str(ck), fault="1:3:sigint")
    assert r.returncode == 130, r.stderr
    assert "mgg.train: SIGINT received: stopped after epoch 3 of 8; checkpoint" in r.stderr, r.stderr
    s = read_checkpoint(ck / LAST)
    assert s["epoch"] == 3 and s["reason"] == "SIGINT"


@pytest.mark.slow
def test_simulated_two_nodes_cli_matches_one_rank(tmp_path):
    """`mpirun -np 2 ... --ranks-per-node 1`: 2 simulated nodes, the other node's partitions cut by
    --ps-inter, through the command line (2 nodes x 2 ranks, in process: tests/apps/test_multinode_mpi.py
    under -np 4)."""
    r = mpirun(2, "--dataset", "sbm", "--scale", "0.05", "--epochs", "6", "--ps", "8", "--ps-inter", "2",
               "--ranks-per-node", "1", "--metrics-json", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["world_size"] == 2 and doc["config"]["ranks_per_node"] == 1 and doc["config"]["ps_inter"] == 2
    ref = train(TrainConfig(dataset="sbm", scale=0.05, epochs=6, progress=False, backend="cpu"),
                Communicator(comm=None), load_dataset("sbm", scale=0.05, seed=0))
    np.testing.assert_allclose(losses_of(tmp_path / "m.json"), [e["loss"] for e in ref.epochs],
                               rtol=0, atol=1e-5)


# -- launch scripts -------------------------------------------------------------------------------
SCRIPTS = ["launch/mpirun.sh", "launch/srun.sh", "launch/slurm.sbatch"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_launch_script_syntax(script):
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


def test_srun_wrapper_command_lines():
    def dry(*args, **slurm):
        e = env(SLURM_JOB_ID="7", **slurm)
        for k in ("MGG_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_CPUS_PER_TASK",
                  "NVSHMEM_DISABLE_NVLS", "NVSHMEM_BOOTSTRAP"):
            if k not in slurm:
                e.pop(k, None)
        r = subprocess.run(["bash", str(ROOT / "launch" / "srun.sh"), "--dry-run", *args], env=e,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stderr
    out = dry("--", "--epochs", "3", SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="4", SLURM_CPUS_PER_TASK="8")
    assert ("srun --mpi=pmix --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=8 --kill-on-bad-exit=1 "
            "--export=ALL --gpus-per-task=1 --gpu-bind=none python -m mgg.train --epochs 3") in out
    out = dry("--launcher", "mpirun", "--module", "mgg.doctor", SLURM_JOB_NUM_NODES="2",
              SLURM_GPUS_PER_NODE="h100:4", NVSHMEM_SYMMETRIC_SIZE="8G")
    assert "mpirun -np 8 --map-by ppr:4:node" in out and "-x NVSHMEM_BOOTSTRAP" in out
    assert "-x NVSHMEM_DISABLE_NVLS" in out and "-x NVSHMEM_SYMMETRIC_SIZE" in out and "mgg.doctor" in out
    out = dry(SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="3(x2)", MGG_GPUS_PER_NODE="0")
    assert "2 node(s) x 3 rank(s) (CPU path)" in out and "--gpus-per-task" not in out
    r = subprocess.run(["bash", str(ROOT / "launch" / "srun.sh")], env={k: v for k, v in env().items()
                       if not k.startswith("SLURM_")}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not inside a Slurm allocation" in r.stderr
