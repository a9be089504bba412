"""What a new user meets on the training command line: clear refusals, exit 2."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mgg.apps.memory_check import GraphSize, estimate, graph_size
from mgg.data import save_npz
from mgg.data.graph import Graph
from mgg.train import main, parse_args
from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def test_gpu_backend_without_a_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert _exit_code(["--backend", "gpu", "--epochs", "1"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: --backend gpu: no CUDA GPU"), err


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_gpu_backend_without_a_gpu_under_mpirun():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = subprocess.run([*MPIRUN, "-np", "2", sys.executable, "-m", "mgg.train", "--backend", "gpu"], cwd=ROOT,
                       env=subprocess_env(), capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("error: --backend gpu: no CUDA GPU") == 1, r.stderr  # every rank failed; one message
    assert "Traceback" not in r.stderr


def test_memory_check_refuses_before_loading(capsys, monkeypatch):
    assert _exit_code(["--dataset", "papers-like", "--epochs", "1"]) == 2
    cap = capsys.readouterr()
    err = cap.err
    assert "not enough host memory for papers-like" in err and "GiB needed" in err and "--force" in err
    assert "phase load" not in cap.out  # refused before the dataset was generated
    assert _exit_code(["--hidden", "100000000", "--epochs", "1", "--backend", "cpu"]) == 2
    assert "not enough host memory" in capsys.readouterr().err
    monkeypatch.setenv("MGG_MEMORY_AVAILABLE", str(10 * 2**20))  # a 10 MiB host: karate does not fit
    assert _exit_code(["--epochs", "1", "--backend", "cpu"]) == 2
    assert main(["--epochs", "1", "--backend", "cpu", "--force", "--no-progress"]) == 0


def test_memory_estimate_tracks_the_graph(tmp_path):
    import numpy as np

    small = estimate(GraphSize(1000, 10_000, 8), 16, 2, 1, False)
    big = estimate(GraphSize(1000, 10_000_000, 8), 16, 2, 1, False)
    assert big.host_per_rank - small.host_per_rank >= 24 * (10_000_000 - 10_000)  # int64 indices and more
    assert estimate(GraphSize(1000, 10_000_000, 8), 16, 2, 4, False).host_per_rank < big.host_per_rank
    assert estimate(GraphSize(1000, 10, 8), 16, 2, 1, True).gpu_per_rank > 0
    # an .npz's size is read from its headers
    g = Graph(np.array([0, 1, 3]), np.array([1, 0, 1]), np.ones((2, 5), np.float32), np.array([0, 1]))
    save_npz(g, tmp_path / "g.npz")
    assert graph_size(str(tmp_path / "g.npz")) == GraphSize(2, 3, 5, mapped=True)  # stored int64 CSR: mapped
    np.savez_compressed(tmp_path / "c.npz", indptr=g.indptr, indices=g.indices, x=g.x, y=g.y)
    assert graph_size(str(tmp_path / "c.npz")) == GraphSize(2, 3, 5, mapped=False)  # compressed: read whole
    # a mapped file in full-graph mode: each of 4 ranks holds a quarter of the edges, not all of them
    whole = estimate(GraphSize(10_000, 100_000_000, 64), 16, 2, 4, True)
    mapped = estimate(GraphSize(10_000, 100_000_000, 64, mapped=True), 16, 2, 4, True)
    assert whole.host_per_rank - mapped.host_per_rank >= 24 * 100_000_000 - 2 * 8 * 100_000_000 // 4
    assert estimate(GraphSize(10_000, 100_000_000, 64, mapped=True), 16, 2, 4, True, mode="sampled") == \
        estimate(GraphSize(10_000, 100_000_000, 64), 16, 2, 4, True, mode="sampled")  # sampled reads it whole


def test_scale_with_a_file_and_norm_with_another_model_are_refused(tmp_path, capsys):
    import numpy as np

    g = Graph(np.array([0, 1, 2]), np.array([1, 0]), np.ones((2, 3), np.float32), np.array([0, 1]))
    save_npz(g, tmp_path / "g.npz")
    with pytest.raises(SystemExit) as e:
        parse_args(["--dataset", str(tmp_path / "g.npz"), "--scale", "0.5"])
    assert e.value.code == 2 and "--scale applies to generated datasets only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model", "gcn", "--norm", "batch"])
    assert "--norm applies to --model gin" in capsys.readouterr().err
    assert parse_args(["--model", "gin", "--norm", "layer"]).norm == "layer"


def test_help_states_the_defaults():
    from mgg.apps.args import build_parser

    text = " ".join(build_parser().format_help().split())  # what `python -m mgg.train --help` prints
    for needle in ("training epochs (default 200, full-graph and --mode sampled alike)",
                   "Adam learning rate (model default: gcn 0.01", "dropout before every layer (model default:",
                   "seed of weights", "--force", "(default, karate, sbm, reddit-like, products-like, papers-like;",
                   "default is karate"):
        assert needle in text, needle


def test_scale_with_the_karate_club_is_refused(capsys):
    for dataset in ([], ["--dataset", "karate"]):
        assert _exit_code([*dataset, "--scale", "0.5", "--epochs", "1"]) == 2
        err = capsys.readouterr().err
        assert "--scale applies to generated datasets only" in err and "karate club" in err, err
    assert parse_args(["--dataset", "sbm", "--scale", "0.5"]).scale == 0.5


def test_misspelled_dataset_gets_did_you_mean(capsys):
    assert _exit_code(["--dataset", "redit-like", "--epochs", "1", "--backend", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown dataset 'redit-like' (did you mean 'reddit-like'?)" in err[0], err


def test_edge_list_without_labels_says_what_is_missing(tmp_path, capsys):
    (tmp_path / "good.txt").write_text("0 1\n1 2\n2 0\n")
    assert _exit_code(["--dataset", str(tmp_path / "good.txt"), "--backend", "cpu", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "loaded (3 nodes, 3 edges) but cannot be trained on" in err and "cannot load" not in err
    assert ".npz or an ogbn-style folder" in err


def test_gin_norm_flag_reaches_the_model(tmp_path):
    import json

    out = tmp_path / "m.json"
    assert main(["--model", "gin", "--norm", "none", "--epochs", "2", "--backend", "cpu", "--no-progress",
                 "--metrics-json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["norm"] == "none"


@pytest.mark.slow
def test_progress_is_plain_lines_when_stderr_is_not_a_terminal():
    env = subprocess_env()
    env.pop("CI", None)
    r = subprocess.run([sys.executable, "-m", "mgg.train", "--epochs", "20", "--backend", "cpu"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ": epoch " in ln]
    shown = [ln.split()[3] for ln in lines]  # every 10% (and after 30 s without a line, on a slow host)
    assert set(f"{k}/20" for k in range(2, 21, 2)) <= set(shown) and shown[-1] == "20/20", lines
    assert all("/epoch" in ln for ln in lines) and all(" left)" in ln for ln in lines[:-1]), lines


def test_plain_progress_estimates_the_time_left(capsys):
    from mgg.apps.loop import PlainProgress

    now = [0.0]
    bar = PlainProgress(total=100, initial=20, desc="gcn x2", every=10, clock=lambda: now[0])
    for _ in range(20):  # 2 s an epoch: a line at epochs 30 and 40
        now[0] += 2.0
        bar.set_postfix(loss="0.5")
        bar.update()
    now[0] += 45.0  # a slow epoch: a line although 41 is no multiple of 10
    bar.update()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["gcn x2: epoch 30/100 loss=0.5 (2.00 s/epoch, 2 min left)",
                     "gcn x2: epoch 40/100 loss=0.5 (2.00 s/epoch, 2 min left)",
                     "gcn x2: epoch 41/100 loss=0.5 (4.05 s/epoch, 4 min left)"], lines
