"""The runtime tuner wired into training: DistGraph's per-config caches, `mgg.train --tune`
(search, cache, log, report, resume) and rank agreement under mpirun.

CPU latencies are noisy: these tests check termination, agreement and the cache behaviour, never
which configuration wins.
"""
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from mgg.checkpoint import LAST, read_checkpoint
from mgg.data import load_dataset
from mgg.runtime import Communicator, PlanParams
from mgg.graph import DistGraph, RuntimeConfig
from mgg.train import VARIANTS, TrainConfig, UserError, parse_args, train

from mgg.testing.graphs import random_csr

from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env as env

SOLO = Communicator(comm=None)
# 150 epochs bound the search: at most SearchSpace.budget (12 + one per extra variant) measurements
GRAPH = ["--dataset", "sbm", "--scale", "0.02", "--eval-every", "1000", "--backend", "cpu"]
EPOCHS = 150


def run(*args, timeout=PROCESS_TIMEOUT_S):
    r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def tuner_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("tuner: ")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.fixture(scope="module")
def sbm():
    return load_dataset("sbm", scale=0.02, seed=0)


# -- DistGraph ----------------------------------------------------------------------------------
def test_set_config_reuses_cuts_and_executors():
    indptr, indices = random_csr(150, 1500, seed=4)
    x = torch.randn(150, 4)
    with DistGraph(indptr, indices, SOLO, RuntimeConfig(1, 1, 1, backend="cpu")) as dg:
        ref = dg.aggregate(x, "gcn").clone()
        ex1 = dg.executor("gcn")
        dg.set_config(PlanParams(8, 2, 2), variant="ptr")
        assert dg.params == PlanParams(8, 2, 2) and dg.config.variant == "ptr"
        assert dg.plan("gcn").ps == 8
        torch.testing.assert_close(dg.aggregate(x, "gcn"), ref)
        hits = dg.plan_cache.hits
        dg.set_config(PlanParams(1, 1, 1))  # back: the cut and the executor are reused
        assert dg.plan_cache.hits > hits and dg.executor("gcn") is ex1
        torch.testing.assert_close(dg.aggregate(x, "gcn"), ref)
        for ps in (2, 4, 16, 32):  # LRUs stay small
            dg.set_params(PlanParams(ps, 1, 1))
            dg.aggregate(x, "gcn")
        assert len(dg.plan_cache) <= dg.PLAN_CACHE and len(dg._executors) <= dg.EXECUTOR_CACHE
        dg.release_unused()
        assert len(dg.plan_cache) == 0 and len(dg._executors) == 1
        torch.testing.assert_close(dg.aggregate(x, "gcn"), ref)


# -- flags --------------------------------------------------------------------------------------
def test_flags():
    from mgg.kernels.variants import variant_names

    assert VARIANTS == ("auto",) + variant_names()
    cfg = parse_args(["--tune", "--ps", "8", "--variant", "ptr"])
    assert cfg.tune and cfg.pinned() == {"ps": 8} and cfg.knobs() == {"ps": 8, "dist": 4, "wpb": 4}
    assert cfg.variant == "ptr" and parse_args([]).knobs() == {"ps": 16, "dist": 4, "wpb": 4}
    for bad in (["--tune-log", "x"], ["--tune-cache", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.slow
def test_pinned_dims_are_not_searched(sbm):
    cfg = TrainConfig(dataset="sbm", epochs=EPOCHS, eval_every=1000, backend="cpu", progress=False,
                      tune=True, tune_cache="none", ps=4, wpb=2)
    res = train(cfg, SOLO, sbm)
    assert res.tuning["done"] and res.tuning["search_iterations"] > 0
    assert {(t["ps"], t["wpb"]) for t in res.tuner["trials"]} == {(4, 2)}
    assert res.tuning["config"]["ps"] == 4 and res.tuning["config"]["wpb"] == 2


@pytest.mark.slow
def test_resume_replays_the_tuner(tmp_path, sbm):
    # 3 epochs: fewer measurements than the shortest search ((1,1,1) and one step on each of ps,
    # dist, wpb), so the checkpoint is always taken mid-search, whatever the CPU timings
    cfg = TrainConfig(dataset="sbm", epochs=3, eval_every=1000, backend="cpu", progress=False, tune=True,
                      tune_cache="none", checkpoint_dir=str(tmp_path))
    first = train(cfg, SOLO, sbm)
    saved = read_checkpoint(tmp_path / LAST)["tuner"]
    assert saved["enabled"] and 0 < len(saved["trials"]) and not first.tuning["done"]
    second = train(replace(cfg, epochs=EPOCHS, resume="auto"), SOLO, sbm)
    assert second.tuning["done"] and second.tuner["trials"][:len(saved["trials"])] == saved["trials"]
    # a checkpoint of another search space is refused clearly
    with pytest.raises(UserError, match="another search"):
        train(replace(cfg, epochs=EPOCHS + 1, resume="auto", ps=32, dist=16), SOLO, sbm)


# -- CLI: search, cache, log, report ------------------------------------------------------------
@pytest.mark.slow
def test_cli_tune_cache_and_report(tmp_path):
    cache, log, log2, metrics = (tmp_path / n for n in ("cache.json", "log.json", "log2.json", "m.json"))
    first = run("-m", "mgg.train", *GRAPH, "--epochs", str(EPOCHS), "--tune", "--tune-cache", str(cache),
                "--tune-log", str(log), "--metrics-json", str(metrics))
    assert "(done)" in tuner_line(first.stdout)
    m = json.loads(metrics.read_text())["tuner"]
    assert m["enabled"] and m["done"] and not m["from_cache"] and m["search_iterations"] > 0
    assert json.loads(cache.read_text()) and json.loads(log.read_text())["trials"]
    best = m["best"]
    assert {k: m["config"][k] for k in ("ps", "dist", "wpb")} == {k: best[k] for k in ("ps", "dist", "wpb")}

    second = run("-m", "mgg.train", *GRAPH, "--epochs", "3", "--tune", "--tune-cache", str(cache),
                 "--tune-log", str(log2))
    line = tuner_line(second.stdout)
    assert "search_iterations=0 (from cache)" in line
    assert f"ps={best['ps']} dist={best['dist']} wpb={best['wpb']}" in line

    rep = run("-m", "mgg.tune", "--report", str(log), "--no-plot")
    assert "latency_ms" in rep.stdout and "measurements" in rep.stdout and "*" in rep.stdout
    assert "from cache" in run("-m", "mgg.tune", "--report", str(log2), "--no-plot").stdout


# -- ranks agree --------------------------------------------------------------------------------
AGREE = """
import json, sys
from mgg.runtime import world
from mgg.train import TrainConfig, _load, train
comm = world()
cfg = TrainConfig(dataset="sbm", scale=0.02, epochs=%d, eval_every=1000, backend="cpu", progress=False,
                  tune=True, tune_cache=sys.argv[1])
graph, prep = _load(cfg, comm)
res = train(cfg, comm, graph, prep)
t = res.tuning
print("RANK", comm.rank, json.dumps({"config": t["config"], "best": t["best"], "done": t["done"],
                                     "trials": res.tuner["trials"]}, sort_keys=True), flush=True)
""" % EPOCHS


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_ranks_agree_under_mpirun(tmp_path):
    cache = tmp_path / "cache.json"
    cmd = [*MPIRUN, "-np", "2"]
    for v in ("PYTHONPATH", "OMPI_MCA_osc", "CI", "OMP_NUM_THREADS"):
        cmd += ["-x", v]
    r = subprocess.run(cmd + [sys.executable, "-c", AGREE, str(cache)], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    per_rank = dict(ln.split(" ", 2)[1:] for ln in r.stdout.splitlines() if ln.startswith("RANK "))
    assert set(per_rank) == {"0", "1"}, r.stdout + r.stderr
    assert per_rank["0"] == per_rank["1"]  # same trials (max over ranks), same pick, same config
    doc = json.loads(per_rank["0"])
    assert doc["done"] and doc["trials"] and cache.exists()
