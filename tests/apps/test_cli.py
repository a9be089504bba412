"""The mgg.train command line, run as subprocesses (single process and under mpirun)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mgg.testing.paths import ROOT
from mgg.testing.processes import PROCESS_TIMEOUT_S, subprocess_env as env, train_cli


@pytest.mark.slow
def test_metrics_json(tmp_path):
    out = tmp_path / "sub" / "metrics.json"
    r = train_cli("--epochs", "3", "--backend", "cpu", "--metrics-json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    for key in ("dataset", "model", "world_size", "test_acc", "epochs", "config", "median_epoch_ms", "final_loss"):
        assert key in doc, key
    assert doc["world_size"] == 1 and doc["model"] == "gcn"
    assert len(doc["epochs"]) == 3
    for rec in doc["epochs"]:
        assert set(rec) >= {"epoch", "loss", "train_acc", "val_acc", "epoch_ms"}
    assert doc["config"]["hidden"] == 16 and doc["config"]["weight_decay"] == 5e-4
    assert "test_acc=" in r.stdout and "median_epoch_ms=" in r.stdout
    assert not list(out.parent.glob(".*tmp*"))  # atomic write left no temp file


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--ps", "0"], "--ps"),
    (["--dist", "17"], "--dist"),
    (["--wpb", "x"], "--wpb"),
    (["--model", "foo"], "--model"),
    (["--epochs", "0"], "--epochs"),
    (["--lr", "-1"], "--lr"),
    (["--scale", "1.5"], "--scale"),
    (["--dropout", "1"], "--dropout"),
    (["--backend", "tpu"], "--backend"),
])
def test_bad_flag_values(args, needle):
    r = train_cli(*args)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["/nonexistent.npz", "no-such-dataset"])
def test_bad_dataset(dataset):
    r = train_cli("--dataset", dataset, "--epochs", "1", "--backend", "cpu")
    assert r.returncode == 2
    assert r.stderr.startswith("error:") and dataset in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_corrupt_file(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, indptr=np.array([0, 5]), indices=np.array([0]))  # indptr[-1] != len(indices)
    r = train_cli("--dataset", str(bad), "--epochs", "1", "--backend", "cpu")
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_mpirun_bad_dataset_fails_on_every_rank_with_one_message():
    """Every rank fails (exit 2); the launcher shows the error once, without Open MPI's box after it."""
    r = subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--dataset",
                        "/nonexistent.npz", "--backend", "cpu"], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "/nonexistent.npz" in errors[0], r.stderr
    assert "non-zero status" not in r.stderr and "-----" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_mpirun_two_ranks_metrics(tmp_path):
    out = tmp_path / "m.json"
    r = subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--epochs", "3",
                        "--backend", "cpu", "--model", "sage", "--metrics-json", str(out)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and doc["model"] == "sage" and len(doc["epochs"]) == 3


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_mpirun_wrapper_help_shows_its_own_usage_first(flag):
    """`launch/mpirun.sh --help`: the wrapper's usage (its -np, defaults, environment), then
    mgg.train's flags; nothing is launched."""
    r = subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", flag], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    usage = out.index("launch/mpirun.sh [-np N]")
    train_usage = out.index("usage: mgg.train")
    assert usage < out.index("MGG_MPIRUN_ARGS") < train_usage < out.index("--checkpoint-dir", train_usage)
    assert "#" not in out[:out.index("usage: mgg.train")]  # the comment block, shown as text
    assert "set -euo" not in out


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--metrics-json", "--checkpoint-dir", "--tune-log"])
def test_unwritable_output_is_refused_before_the_first_epoch(tmp_path, flag):
    """Outputs written after training are checked first: one line, exit 2, and no epoch ran (the
    fault hook would raise in epoch 1)."""
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "out"
    extra = ["--tune"] if flag == "--tune-log" else []
    r = subprocess.run([sys.executable, "-m", "mgg.train", "--backend", "cpu", "--epochs", "3", flag, str(bad),
                        *extra], cwd=ROOT, env=env(MGG_FAULT_INJECT="0:1:raise"), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    where = bad if flag == "--checkpoint-dir" else bad.parent
    assert r.stderr == f"error: {flag} {bad}: cannot write into {where}: {bad.parent} is not a folder\n"
    assert r.stdout == ""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_folder_is_refused_before_the_first_epoch(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = train_cli("--backend", "cpu", "--epochs", "3", "--metrics-json", str(ro / "m.json"))
    finally:
        ro.chmod(0o700)
    assert r.returncode == 2 and r.stderr.startswith(f"error: --metrics-json {ro / 'm.json'}: cannot write "
                                                     f"into {ro}: Permission denied"), r.stderr
