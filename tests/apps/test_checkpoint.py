"""Checkpoint format, resume equivalence and graceful stop (single process; P ranks: tests/apps/test_multinode_mpi.py)."""
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from mgg.checkpoint import (LAST, MAGIC, PREV, CheckpointError, StopSignal, check_compatible,
                            find_checkpoint, read_checkpoint, resolve_resume, write_checkpoint)
from mgg.data import load_dataset
from mgg.runtime import Communicator
from mgg.train import TrainConfig, UserError, train

from mgg.testing.paths import ROOT
from mgg.testing.processes import PROCESS_TIMEOUT_S, subprocess_env as env

SOLO = Communicator(comm=None)


def train_cli(*args, timeout=PROCESS_TIMEOUT_S, **extra):
    return subprocess.run([sys.executable, "-m", "mgg.train", "--backend", "cpu", *args], cwd=ROOT,
                          env=env(**extra), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def karate():
    return load_dataset("default")


def state(epoch=1, **over):
    s = {"epoch": epoch, "model": {"w": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {}},
         "rng": {"torch": torch.get_rng_state()}, "history": [{"epoch": 1, "loss": 0.5}],
         "last_eval": {"train_acc": 0.5}, "tuner": {}, "config": {"model": "gcn"},
         "fingerprint": "f" * 32, "world_size": 1, "mgg_version": "0.1.0"}
    s.update(over)
    return s


# -- file format ----------------------------------------------------------------------------------
def test_roundtrip_keeps_last_and_previous(tmp_path):
    for e in (1, 2, 3):
        path = write_checkpoint(tmp_path, state(e, tuner={"ps": 8 * e}))
    assert path == str(tmp_path / LAST)
    last, prev = read_checkpoint(tmp_path / LAST), read_checkpoint(tmp_path / PREV)
    assert (last["epoch"], prev["epoch"]) == (3, 2)
    assert last["tuner"] == {"ps": 24}
    assert torch.equal(last["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LAST, PREV])  # no temp files left
    assert find_checkpoint(tmp_path) == str(tmp_path / LAST)
    os.unlink(tmp_path / LAST)  # a crash between the two renames: prev is still there
    assert find_checkpoint(tmp_path) == str(tmp_path / PREV)


def test_failed_write_keeps_both_checkpoints(tmp_path, monkeypatch):
    for e in (1, 2):
        write_checkpoint(tmp_path, state(e))
    real_fsync = os.fsync

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # fails after the payload is written, before any rename
    with pytest.raises(OSError, match="No space"):
        write_checkpoint(tmp_path, state(3))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert (read_checkpoint(tmp_path / LAST)["epoch"], read_checkpoint(tmp_path / PREV)["epoch"]) == (2, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LAST, PREV])  # temp file removed
    assert (os.stat(tmp_path / LAST).st_mode & 0o777) == 0o644


def test_write_removes_temporaries_of_interrupted_writes(tmp_path):
    """What a crash mid-write leaves (an unlocked .tmp-*-checkpoint.mgg, mode 0600) is removed by
    the next write; other files stay."""
    import tempfile

    for _ in range(3):
        fd, _ = tempfile.mkstemp(dir=tmp_path, prefix=".tmp-", suffix="-" + LAST)
        os.write(fd, MAGIC + b"partial")
        os.close(fd)
    (tmp_path / "notes.txt").write_text("mine")
    write_checkpoint(tmp_path, state(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LAST, "notes.txt"])


@pytest.mark.slow
def test_cli_removes_temporaries_of_interrupted_writes_at_start(tmp_path):
    import tempfile

    ck = tmp_path / "ck"
    ck.mkdir()
    for _ in range(2):
        os.close(tempfile.mkstemp(dir=ck, prefix=".tmp-", suffix="-" + LAST)[0])
    r = train_cli("--epochs", "2", "--checkpoint-dir", str(ck))
    assert r.returncode == 0, r.stderr
    assert f"mgg: removed 2 temporary file(s) that interrupted checkpoint writes left in {ck}" in r.stderr
    assert sorted(p.name for p in ck.iterdir()) == [LAST]


def test_header_is_readable_json(tmp_path):
    write_checkpoint(tmp_path, state(7))
    data = (tmp_path / LAST).read_bytes()
    assert data.startswith(MAGIC)
    header = json.loads(data[len(MAGIC):data.index(b"\n", len(MAGIC))])
    assert header["epoch"] == 7 and len(header["sha256"]) == 64 and header["format"] == 1


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-20] ^= 0x40
    elif how == "truncate-payload":
        data = data[: len(data) - 100]
    elif how == "truncate-header":
        data = data[: len(MAGIC) + 10]
    elif how == "empty":
        data = bytearray()
    elif how == "append":
        data += b"junk"
    elif how == "other-file":
        data = bytearray(b"PK\x03\x04 not a checkpoint")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,needle", [
    ("flip", "corrupt: sha256"), ("truncate-payload", "truncated"), ("truncate-header", "header"),
    ("empty", "bad magic"), ("append", "unexpected bytes"), ("other-file", "not an mgg checkpoint")])
def test_damaged_file_is_refused(tmp_path, how, needle):
    write_checkpoint(tmp_path, state())
    _damage(tmp_path / LAST, how)
    with pytest.raises(CheckpointError, match=needle) as info:
        read_checkpoint(tmp_path / LAST)
    assert str(tmp_path / LAST) in str(info.value)


def test_missing_fields_are_refused(tmp_path):
    s = state()
    del s["rng"]
    write_checkpoint(tmp_path, s)
    with pytest.raises(CheckpointError, match="missing rng"):
        read_checkpoint(tmp_path / LAST)


def test_resolve_resume(tmp_path):
    assert resolve_resume(None, None) is None
    assert resolve_resume("auto", str(tmp_path / "none-yet")) is None  # fresh start
    with pytest.raises(CheckpointError, match="needs --checkpoint-dir"):
        resolve_resume("auto", None)
    with pytest.raises(CheckpointError, match="file not found"):
        resolve_resume(str(tmp_path / "x.mgg"), None)
    with pytest.raises(CheckpointError, match="holds no"):
        resolve_resume(str(tmp_path), None)
    write_checkpoint(tmp_path, state())
    assert resolve_resume(str(tmp_path), None) == str(tmp_path / LAST)
    assert resolve_resume("auto", str(tmp_path)) == str(tmp_path / LAST)


def test_mismatches_are_named():
    cfg = asdict(TrainConfig().resolved())
    s = state(config=cfg, fingerprint="a" * 32, world_size=2)
    check_compatible(s, "c.mgg", fingerprint="a" * 32, world_size=2, config=cfg)
    other = dict(cfg, epochs=500, ps=64, backend="gpu", ps_inter=2)  # runtime knobs may change
    check_compatible(s, "c.mgg", fingerprint="a" * 32, world_size=2, config=other)
    for kw, needle in [({"fingerprint": "b" * 32}, "graph fingerprint"),
                       ({"world_size": 4}, "world size 2 in the checkpoint, 4 now"),
                       ({"config": dict(cfg, hidden=32)}, "hidden=16 in the checkpoint, 32 now"),
                       ({"config": dict(cfg, model="sage")}, "model='gcn'"),
                       ({"config": dict(cfg, lr=0.1)}, "lr=")]:
        args = dict(fingerprint="a" * 32, world_size=2, config=cfg)
        args.update(kw)
        with pytest.raises(CheckpointError, match=needle) as info:
            check_compatible(s, "c.mgg", **args)
        assert "checkpoint c.mgg: belongs to another run" in str(info.value)


# -- resume equivalence (in process) --------------------------------------------------------------
def losses(res):
    return np.array([e["loss"] for e in res.epochs])


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.slow
@pytest.mark.parametrize("model,eval_every", [("gcn", 1), ("gin", 3), ("sage", 2)])
def test_resume_equals_uninterrupted(tmp_path, karate, model, eval_every):
    base = TrainConfig(model=model, epochs=10, backend="cpu", progress=False, eval_every=eval_every)
    straight = train(base, SOLO, karate)
    first = train(replace(base, epochs=5, checkpoint_dir=str(tmp_path)), SOLO, karate)
    # the second half with unrelated RNG draws in between: the checkpoint restores them all
    torch.manual_seed(123), np.random.seed(123), torch.rand(7)
    second = train(replace(base, checkpoint_dir=str(tmp_path), resume="auto"), SOLO, karate)
    assert second.resumed_from == str(tmp_path / LAST) and second.start_epoch == 5
    assert [e["epoch"] for e in second.epochs] == list(range(1, 11))
    np.testing.assert_allclose(losses(second), losses(straight), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(losses(first), losses(straight)[:5])
    assert torch.allclose(flat(second.model), flat(straight.model), rtol=0, atol=1e-6)
    assert second.test_acc == straight.test_acc and second.val_acc == straight.val_acc
    # the run's end wrote a checkpoint too; it replaced the epoch-5 one, which became prev
    assert read_checkpoint(tmp_path / LAST)["epoch"] == 10
    assert read_checkpoint(tmp_path / PREV)["epoch"] == 5


def test_periodic_checkpoints_and_tuner_field(tmp_path, karate):
    cfg = TrainConfig(epochs=7, backend="cpu", progress=False, checkpoint_dir=str(tmp_path), checkpoint_every=3)
    res = train(cfg, SOLO, karate)
    assert read_checkpoint(tmp_path / LAST)["epoch"] == 7 and read_checkpoint(tmp_path / LAST)["reason"] == "end"
    assert read_checkpoint(tmp_path / PREV)["epoch"] == 6 and read_checkpoint(tmp_path / PREV)["reason"] == "periodic"
    s = read_checkpoint(tmp_path / LAST)
    assert s["tuner"] == {} and s["world_size"] == 1 and s["fingerprint"] == karate.fingerprint()
    assert s["config"]["hidden"] == 16 and len(s["history"]) == 7 and res.checkpoint == str(tmp_path / LAST)
    # the tuner's state survives a resume (the tuner fills res.tuner; here we plant one)
    s["tuner"] = {"best": {"ps": 8, "dist": 2}}
    write_checkpoint(tmp_path, s)
    res2 = train(replace(cfg, epochs=8, resume="auto"), SOLO, karate)
    assert res2.tuner == {"best": {"ps": 8, "dist": 2}}
    assert read_checkpoint(tmp_path / LAST)["tuner"] == {"best": {"ps": 8, "dist": 2}}


def test_resume_refusals(tmp_path, karate):
    train(TrainConfig(epochs=4, backend="cpu", progress=False, checkpoint_dir=str(tmp_path)), SOLO, karate)
    ck = str(tmp_path / LAST)
    with pytest.raises(UserError, match="nothing to train"):
        train(TrainConfig(epochs=4, backend="cpu", resume=ck), SOLO, karate)
    with pytest.raises(UserError, match="hidden=16 in the checkpoint, 8 now"):
        train(TrainConfig(epochs=6, hidden=8, backend="cpu", resume=ck), SOLO, karate)
    with pytest.raises(UserError, match="graph fingerprint"):
        train(TrainConfig(dataset="sbm", epochs=6, backend="cpu", resume=ck), SOLO,
              load_dataset("sbm", scale=0.01))
    _damage(tmp_path / LAST, "flip")
    with pytest.raises(UserError, match=f"{ck}: corrupt"):
        train(TrainConfig(epochs=6, backend="cpu", resume=ck), SOLO, karate)


def test_stop_signal_sets_flag_and_restores_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested == signal.SIGTERM and stop.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before


def test_stop_signal_takes_sigint_instead_of_keyboard_interrupt():
    """Ctrl-C stops after the epoch like SIGTERM; a second Ctrl-C raises KeyboardInterrupt at once."""
    before = signal.getsignal(signal.SIGINT)
    with StopSignal() as stop:
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt
        assert stop.requested == signal.SIGINT and stop.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == before


def test_stop_signal_reads_sigusr2_as_sigterm_only_when_the_wrapper_says_so(monkeypatch):
    """launch/mpirun.sh forwards a SIGTERM as SIGUSR2 (mpirun would kill on SIGTERM) and sets
    MGG_SIGUSR2_IS_SIGTERM=1; without that variable SIGUSR2 keeps its default meaning."""
    monkeypatch.setenv("MGG_SIGUSR2_IS_SIGTERM", "1")
    with StopSignal() as stop:
        signal.raise_signal(signal.SIGUSR2)
        assert stop.requested == signal.SIGTERM and stop.name == "SIGTERM"
    monkeypatch.delenv("MGG_SIGUSR2_IS_SIGTERM")
    before = signal.getsignal(signal.SIGUSR2)
    with StopSignal():
        assert signal.getsignal(signal.SIGUSR2) == before


# -- the CLI ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_cli_signal_checkpoint_then_resume_equals_straight(tmp_path, karate, sig, code):
    """SIGTERM, and SIGINT (Ctrl-C) alike: a checkpoint after the epoch, exit 128 + the signal."""
    ck = tmp_path / "ck"
    straight = train(TrainConfig(epochs=8, backend="cpu", progress=False), SOLO, karate)
    b = train_cli("--epochs", "8", "--checkpoint-dir", str(ck), MGG_FAULT_INJECT=f"0:3:{sig.lower()}")
    assert b.returncode == code, b.stderr
    assert (f"mgg.train: {sig} received: stopped after epoch 3 of 8; checkpoint {ck / LAST} written at "
            f"epoch 3; continue with --resume auto") in b.stderr, b.stderr
    assert "Traceback" not in b.stderr and "KeyboardInterrupt" not in b.stderr
    assert read_checkpoint(ck / LAST)["epoch"] == 3 and read_checkpoint(ck / LAST)["reason"] == sig
    c = subprocess.run([sys.executable, "-m", "mgg.train", "--backend", "cpu", "--epochs", "8", "--checkpoint-dir",
                        str(ck), "--resume", "--metrics-json", str(tmp_path / "c.json")], cwd=ROOT,
                       env=env(CI=""), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=PROCESS_TIMEOUT_S)
    assert c.returncode == 0, c.stdout
    resumed = c.stdout.index(f"resumed from {ck / LAST} after epoch 3")  # said before the epochs it explains
    assert resumed < c.stdout.index("epoch 4/8") < c.stdout.index("train_acc="), c.stdout
    lc = [e["loss"] for e in json.loads((tmp_path / "c.json").read_text())["epochs"]]
    assert len(lc) == 8
    np.testing.assert_allclose(lc, losses(straight), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_cli_resume_auto_starts_fresh_and_corrupt_file_is_refused(tmp_path):
    ck = tmp_path / "ck"
    r = train_cli("--epochs", "2", "--checkpoint-dir", str(ck), "--resume", "auto")
    assert r.returncode == 0, r.stderr
    assert "resumed" not in r.stdout and (ck / LAST).is_file()
    assert f"--resume auto: no checkpoint in {ck}; training starts at epoch 1" in r.stdout, r.stdout
    _damage(ck / LAST, "truncate-payload")
    r = train_cli("--epochs", "4", "--checkpoint-dir", str(ck), "--resume", "auto")
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: cannot resume: checkpoint {ck / LAST}: truncated")
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_resume_auto_falls_back_to_the_previous_checkpoint(tmp_path, karate):
    """A damaged checkpoint.mgg: --resume auto continues from checkpoint.prev.mgg with a warning;
    --resume naming the damaged file refuses and names the previous one."""
    ck = tmp_path / "ck"
    straight = train(TrainConfig(epochs=6, backend="cpu", progress=False), SOLO, karate)
    r = train_cli("--epochs", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(ck))
    assert r.returncode == 0, r.stderr
    assert (read_checkpoint(ck / LAST)["epoch"], read_checkpoint(ck / PREV)["epoch"]) == (4, 2)
    _damage(ck / LAST, "flip")
    r = train_cli("--epochs", "6", "--checkpoint-dir", str(ck), "--resume", str(ck / LAST))
    assert r.returncode == 2 and f"{ck / LAST}: corrupt" in r.stderr, r.stderr
    assert f"--resume {ck / PREV}" in r.stderr and "Traceback" not in r.stderr
    r = train_cli("--epochs", "6", "--checkpoint-dir", str(ck), "--resume", "auto", "--metrics-json",
                  str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    assert f"warning: checkpoint {ck / LAST} is unusable (corrupt" in r.stderr
    assert f"resumed from {ck / PREV} after epoch 2" in r.stdout
    lr = [e["loss"] for e in json.loads((tmp_path / "m.json").read_text())["epochs"]]
    np.testing.assert_allclose(lr, losses(straight), rtol=0, atol=1e-6)


def test_broken_symlinks_are_named_not_skipped(tmp_path):
    """A checkpoint.mgg that is a looping or dangling symbolic link is found (not skipped for the
    previous checkpoint, or for a fresh start) and its problem named when it is read."""
    (tmp_path / LAST).symlink_to(LAST)  # loops onto itself
    assert find_checkpoint(tmp_path) == str(tmp_path / LAST)
    with pytest.raises(CheckpointError, match=r"cannot read: a symbolic link \(to checkpoint.mgg\) that loops"):
        read_checkpoint(tmp_path / LAST)
    os.unlink(tmp_path / LAST)
    (tmp_path / LAST).symlink_to(tmp_path / "gone.mgg")
    with pytest.raises(CheckpointError, match=f"a symbolic link to {tmp_path / 'gone.mgg'}, which does not exist"):
        read_checkpoint(tmp_path / LAST)
    assert resolve_resume(str(tmp_path / LAST), None) == str(tmp_path / LAST)  # read, not "not found"


@pytest.mark.slow
def test_cli_resume_auto_with_a_broken_checkpoint_symlink(tmp_path, karate):
    """--resume auto and a checkpoint.mgg that is a symbolic link loop: with checkpoint.prev.mgg
    the run continues from it with a warning naming the link; without one it stops before any
    epoch (one line, exit 2) instead of starting again from epoch 0."""
    ck = tmp_path / "ck"
    straight = train(TrainConfig(epochs=6, backend="cpu", progress=False), SOLO, karate)
    r = train_cli("--epochs", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(ck))
    assert r.returncode == 0, r.stderr
    os.unlink(ck / LAST)
    (ck / LAST).symlink_to(LAST)
    r = train_cli("--epochs", "6", "--checkpoint-dir", str(ck), "--resume", "auto", "--metrics-json",
                  str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    assert (f"mgg: warning: checkpoint {ck / LAST} is unusable (cannot read: a symbolic link (to checkpoint.mgg) "
            f"that loops); resuming from the previous checkpoint {ck / PREV} (epoch 2) instead") in r.stderr, r.stderr
    assert f"resumed from {ck / PREV} after epoch 2" in r.stdout
    lr = [e["loss"] for e in json.loads((tmp_path / "m.json").read_text())["epochs"]]
    np.testing.assert_allclose(lr, losses(straight), rtol=0, atol=1e-6)
    assert read_checkpoint(ck / LAST)["epoch"] == 6 and not (ck / LAST).is_symlink()  # replaced by a file

    os.unlink(ck / PREV)
    os.unlink(ck / LAST)
    (ck / LAST).symlink_to(LAST)
    r = train_cli("--epochs", "8", "--checkpoint-dir", str(ck), "--resume", "auto", MGG_FAULT_INJECT="0:1:raise")
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"error: cannot resume: checkpoint {ck / LAST}: cannot read: a symbolic link (to "
                        f"checkpoint.mgg) that loops; there is no previous checkpoint {PREV} to fall back on "
                        f"(move the file away to start from epoch 0)\n")


def test_read_newest_with_both_checkpoints_damaged(tmp_path):
    from mgg.checkpoint import read_newest

    write_checkpoint(tmp_path, state(epoch=1))
    write_checkpoint(tmp_path, state(epoch=2))
    path, s, warning = read_newest(str(tmp_path / LAST), fallback=True)
    assert (path, s["epoch"], warning) == (str(tmp_path / LAST), 2, "")
    _damage(tmp_path / LAST, "truncate-payload")
    path, s, warning = read_newest(str(tmp_path / LAST), fallback=True)
    assert (path, s["epoch"]) == (str(tmp_path / PREV), 1) and "truncated" in warning
    _damage(tmp_path / PREV, "empty")
    with pytest.raises(CheckpointError, match="truncated.*previous checkpoint .* unusable too: .*bad magic"):
        read_newest(str(tmp_path / LAST), fallback=True)


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--resume", "auto"], "--resume auto needs --checkpoint-dir"),
    (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
    (["--checkpoint-every", "-1", "--checkpoint-dir", "x"], "--checkpoint-every"),
    (["--watchdog-timeout", "-5"], "--watchdog-timeout"),
    (["--ps-inter", "0"], "--ps-inter"),
    (["--ranks-per-node", "0"], "--ranks-per-node"),
])
def test_cli_flag_errors(args, needle):
    r = train_cli(*args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_bad_fault_hook_value():
    r = train_cli("--epochs", "1", MGG_FAULT_INJECT="one:two")
    assert r.returncode == 2 and "MGG_FAULT_INJECT='one:two'" in r.stderr


def test_dropout_state_of_another_cuda_graph_setting_is_refused_by_name():
    """A checkpoint written without --cuda-graph holds a generator's state; a run with it keeps
    its dropout seeds on the device (DeviceSeeds): the mismatch is a CheckpointError naming the
    flag, not a raw error from deep inside (and the reverse likewise)."""
    from mgg.checkpoint import capture_state, restore_state
    from mgg.nn.functional import DeviceSeeds

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = dict(history=[], last_eval={}, tuner={}, config={}, fingerprint="f", world_size=1)
    eager = capture_state(1, model, opt, torch.Generator().manual_seed(1), **kw)
    graphed = capture_state(1, model, opt, DeviceSeeds(torch.Generator().manual_seed(1), "cpu"), **kw)
    restore_state(graphed, model, opt, DeviceSeeds(None, "cpu"))  # the same setting: fine
    with pytest.raises(CheckpointError, match="--cuda-graph"):
        restore_state(eager, model, opt, DeviceSeeds(None, "cpu"), "a.mgg")
    with pytest.raises(CheckpointError, match="--cuda-graph"):
        restore_state(graphed, model, opt, torch.Generator(), "b.mgg")
