"""`python -m mgg.train --mode sampled` (subprocesses) and `train` in sampled mode on one process."""
import json

import numpy as np
import pytest

from mgg.data import prepare_graph
from mgg.runtime import Communicator
from mgg.train import TrainConfig, UserError, parse_args, train
from mgg.testing.paths import ROOT
from mgg.testing.processes import subprocess_env as env
from mgg.testing.graphs import cached_dataset
from mgg.testing.processes import train_cli


@pytest.mark.slow
def test_sampled_cli_runs_on_the_default_dataset(tmp_path):
    out = tmp_path / "m.json"
    r = train_cli("--mode", "sampled", "--fanout", "5,5", "--batch-size", "16", "--epochs", "3",
                  "--backend", "cpu", "--metrics-json", str(out), "--reorder", "--batch-size", "4")
    assert r.returncode == 0, r.stderr
    assert "mode=sampled" in r.stdout and "test_acc=" in r.stdout and "sampling: fanout=5,5" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "sampled" and doc["model"] == "sage" and doc["config"]["fanout"] == [5, 5]
    s = doc["sampling"]
    assert s["batch_size"] == 4 and s["steps_per_epoch"] == 2 and s["feature_tier"] == "store" and s["reorder"]
    assert s["bytes_fetched_total"] <= s["bytes_identity_order_total"] <= s["bytes_no_reuse_total"]
    assert len(doc["epochs"]) == 3
    for rec in doc["epochs"]:
        assert {"epoch_ms", "bytes_fetched", "rows_fetched", "rows_reused", "bytes_no_reuse",
                "bytes_identity_order", "steps", "loss", "train_acc"} <= set(rec)
        assert rec["steps"] == 2 and rec["rows_fetched"] * 34 * 4 == rec["bytes_fetched"]
    assert doc["test_acc"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--mode", "sampled", "--fanout", "0,5"], "--fanout: fanout 0 (position 1) must be a positive integer or -1"),
    (["--mode", "sampled", "--fanout", "5,-2"], "--fanout: fanout -2 (position 2)"),
    (["--mode", "sampled", "--fanout", "5,a"], "--fanout: fanout 'a' (position 2) is not an integer"),
    (["--mode", "sampled", "--fanout", ""], "--fanout: expected comma-separated fanouts"),
    (["--mode", "sampled", "--batch-size", "0"], "--batch-size: must be an integer >= 1, got 0"),
    (["--mode", "sampled", "--batch-size", "x"], "--batch-size: expected an integer"),
    (["--mode", "sampled", "--feature-memory-budget", "lots"], "--feature-memory-budget: expected a size"),
    (["--mode", "sampled", "--fanout", "5,5", "--layers", "3"], "--layers 3 conflicts with --fanout 5,5"),
    (["--mode", "sampled", "--model", "gin"], "--mode sampled supports --model gcn, sage, gat only"),
    (["--mode", "sampled", "--tune"], "--tune is not supported with --mode sampled"),
    (["--mode", "batch"], "--mode"),
    (["--fanout", "5,5"], "--fanout needs --mode sampled"),
    (["--batch-size", "16"], "--batch-size needs --mode sampled"),
    (["--reorder"], "--reorder/--no-reorder needs --mode sampled"),
    (["--no-prefetch"], "--prefetch/--no-prefetch needs --mode sampled"),
])
def test_sampled_bad_flags(args, needle):
    r = train_cli(*args, "--epochs", "1", "--backend", "cpu")
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_parse_sampled_defaults():
    cfg = parse_args(["--mode", "sampled"])
    assert cfg.model == "sage" and cfg.fanout is None
    r = cfg.resolved()
    assert r.fanout == (25, 10) and r.layers == 2 and r.batch_size == 1024 and r.reorder is False
    assert r.feature_memory_budget == 0 and r.sample_seed == 0
    cfg = parse_args(["--mode", "sampled", "--fanout", "10,-1,3", "--feature-memory-budget", "1.5K", "--no-reorder"])
    assert cfg.fanout == (10, -1, 3) and cfg.resolved().layers == 3 and cfg.feature_memory_budget == 1536
    assert cfg.reorder is False and cfg.prefetch is None
    assert parse_args(["--mode", "sampled", "--no-prefetch"]).prefetch is False
    assert parse_args([]).model == "gcn" and parse_args([]).mode == "full"


def test_sampled_train_api_errors_and_host_tier():
    g = cached_dataset("default")
    comm = Communicator(comm=None)
    with pytest.raises(UserError, match="--model gcn, sage, gat only"):
        train(TrainConfig(mode="sampled", model="gin", epochs=1, backend="cpu"), comm, g)
    with pytest.raises(UserError, match=r"--fanout\[1\] must be a positive integer"):
        train(TrainConfig(mode="sampled", model="sage", fanout=(3, 0), epochs=1, backend="cpu"), comm, g)
    with pytest.raises(UserError, match="mode must be one of"):
        train(TrainConfig(mode="minibatch", epochs=1, backend="cpu"), comm, g)
    # 34 x 34 float32 = 4624 bytes > 1 KiB: the host tier
    res = train(TrainConfig(mode="sampled", model="sage", fanout=(4, 4), batch_size=3, epochs=4, backend="cpu",
                            feature_memory_budget=1024, progress=False), comm, g)
    assert res.sampling["feature_tier"] == "host" and res.sampling["steps_per_epoch"] == 3
    assert res.mode == "sampled" and np.isfinite(res.final_loss) and 0 <= res.test_acc <= 1


@pytest.mark.slow
def test_sampled_training_on_sbm_learns():
    g = cached_dataset("sbm")
    cfg = TrainConfig(dataset="sbm", mode="sampled", model="sage", fanout=(10, 5), batch_size=64, epochs=5,
                      backend="cpu", progress=False, reorder=True)
    res = train(cfg, Communicator(comm=None), g)
    losses = [e["loss"] for e in res.epochs]
    assert losses[-1] < 0.7 * losses[0]
    assert res.test_acc > 0.6  # 7 balanced classes: chance is 0.14
    s = res.sampling
    assert s["bytes_fetched_total"] <= s["bytes_identity_order_total"] < s["bytes_no_reuse_total"]


@pytest.mark.slow
@pytest.mark.parametrize("dataset,model", [("default", "sage"), ("sbm", "sage"), ("sbm", "gat")])
def test_sampled_with_all_neighbors_and_one_batch_is_full_graph_training(dataset, model):
    """fanout -1, one batch holding every training node, no dropout: the sampled step computes the
    full-graph gradient, so --mode sampled follows --mode full (same initial weights). (Not GCN:
    on a block its source degrees count the block's edges only, DGL's convention.)"""
    import torch

    g = cached_dataset(dataset)
    comm = Communicator(comm=None)
    common = dict(dataset=dataset, model=model, epochs=15, backend="cpu", dropout=0.0, progress=False)
    full = train(TrainConfig(**common), comm, g)
    n_train = int(prepare_graph(g, 0).train.sum())  # --batch-size n_train: one step holds them all
    samp = train(TrainConfig(mode="sampled", fanout=(-1, -1), batch_size=n_train, **common), comm, g)
    assert np.allclose([e["loss"] for e in full.epochs], [e["loss"] for e in samp.epochs], rtol=0, atol=1e-5)
    wf = torch.cat([p.detach().flatten() for p in full.model.parameters()])
    ws = torch.cat([p.detach().flatten() for p in samp.model.parameters()])
    assert torch.allclose(wf, ws, atol=1e-5)
    assert full.test_acc == samp.test_acc


def test_sampled_step_is_adam_on_the_batch_mean_loss():
    """Against an independent loop: torch.optim.Adam (with the default weight decay) on
    F.cross_entropy's batch mean of the full-graph SAGE's logits, over the global batches of
    mgg.sample.batching. With fanout -1 and no dropout, --mode sampled takes the same steps, so
    the step's loss is the batch mean at every batch size (several steps per epoch)."""
    import torch
    import torch.nn.functional as F

    from mgg.nn import SampledSAGE
    from mgg.graph import DistGraph, RuntimeConfig
    from mgg.sample import BatchPlan, epoch_order

    g = cached_dataset("sbm")
    prep = prepare_graph(g, 0)
    batch, epochs = 50, 2
    res = train(TrainConfig(dataset="sbm", mode="sampled", model="sage", fanout=(-1, -1), batch_size=batch,
                            epochs=epochs, dropout=0.0, backend="cpu", progress=False), Communicator(comm=None), g)
    torch.manual_seed(0)  # --seed 0: the model is drawn first
    model = SampledSAGE(prep.x.shape[1], 64, prep.num_classes, 2, 0.0)
    full = model.to_full_graph().train()
    opt = torch.optim.Adam(full.parameters(), lr=0.01, weight_decay=5e-4)
    dg = DistGraph(g.indptr, g.indices, Communicator(comm=None), RuntimeConfig(backend="cpu"))
    x, y = torch.from_numpy(prep.x), torch.from_numpy(prep.y)
    seeds = np.flatnonzero(prep.train)
    plan = BatchPlan(len(seeds), batch)
    losses = []
    for epoch in range(1, epochs + 1):
        order, steps = epoch_order(len(seeds), 0, epoch), []
        for lo, hi in plan.shares():
            b = torch.from_numpy(seeds[order[lo:hi]])
            opt.zero_grad()
            loss = F.cross_entropy(full(x, dg, None)[b], y[b])
            loss.backward()
            opt.step()
            steps.append(loss.item())
        losses.append(np.mean(steps))
    dg.close()
    assert plan.steps == res.sampling["steps_per_epoch"] == 6
    assert np.allclose([e["loss"] for e in res.epochs], losses, rtol=0, atol=1e-5)
    want = torch.cat([p.detach().flatten() for p in full.parameters()])
    got = torch.cat([p.detach().flatten() for p in res.model.parameters()])
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_sampled_gcn_and_gat_learn_sbm(model):
    g = cached_dataset("sbm")
    res = train(TrainConfig(dataset="sbm", mode="sampled", model=model, fanout=(5, 5), batch_size=32, epochs=10,
                            backend="cpu", progress=False), Communicator(comm=None), g)
    assert res.sampling["steps_per_epoch"] == 9 and type(res.model).__name__ == f"Sampled{model.upper()}"
    losses = [e["loss"] for e in res.epochs]
    assert losses[-1] < 0.7 * losses[0]
    assert res.val_acc > 0.6, res.val_acc  # 7 balanced classes: chance is 0.14


@pytest.mark.slow
@pytest.mark.needs_mpirun
@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "5"], "--batch-size 5 is larger than the training set allows: 8 training nodes, over 2 ranks, "
                            "at most 4 per rank and step"),
    (["--batch-size", "4", "--feature-memory-budget", "64"], "--feature-memory-budget 64 bytes cannot hold one "
                                                             "mini-batch"),
    (["--fanout", "5,5,5", "--layers", "2"], "--layers 2 conflicts with --fanout 5,5,5"),
])
def test_bad_sampled_input_under_mpirun_is_one_line_once(args, needle):
    import subprocess

    r = subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "--mode", "sampled", "--backend", "cpu",
                        "--epochs", "1", *args], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count(needle) == 1, r.stderr  # every rank stops with it; rank 0 prints it once


def test_sampled_summary_reports_sampled_edges_per_second():
    """The metrics' sampling block and the summary line carry the sampler's rate: every epoch's
    sampled edges over every epoch's sampling time (the per-epoch records are the reference)."""
    from mgg.apps.report import sampling_line
    from mgg.apps.sampled import sampled_edges_per_s

    g = cached_dataset("sbm")
    res = train(TrainConfig(dataset="sbm", mode="sampled", model="sage", fanout=(5, 3), batch_size=40, epochs=2,
                            backend="cpu", progress=False), Communicator(comm=None), g)
    s = res.sampling
    edges = sum(e["edges"] for e in res.epochs)
    ms = sum(e["sample_ms"] for e in res.epochs)
    assert edges == s["edges_total"] > 0 and ms > 0
    assert s["sample_ms_total"] == pytest.approx(ms)
    assert s["sampled_edges_per_s"] == pytest.approx(edges / (ms / 1e3))
    line = sampling_line(s)
    assert f"sampled_edges={edges} sample_rate={s['sampled_edges_per_s'] / 1e6:.2f}M edges/s per rank" in line
    assert "sample_rate" not in sampling_line({**s, "sampled_edges_per_s": None})
    assert sampled_edges_per_s(10, 0.0) is None and sampled_edges_per_s(3000, 1.5) == pytest.approx(2e6)


def test_batches_reuse_resident_rows_only_where_a_fetch_is_dear():
    """ResidentCache reuse: off for the GPUs' symmetric store at any P (gathering again costs less
    GPU time than the reuse's lookup and scatters), on for the host tier, the CPU and Match-Reorder."""
    from types import SimpleNamespace as NS

    import torch

    from mgg.apps.sampled import reuse_pays

    cfg = NS(reorder=False)
    gpu_store = NS(tier="store", device=torch.device("cuda", 0))
    for size in (1, 2, 4):
        assert not reuse_pays(cfg, NS(size=size), gpu_store)
    assert reuse_pays(NS(reorder=True), NS(size=2), gpu_store)
    assert reuse_pays(cfg, NS(size=2), NS(tier="store", device=torch.device("cpu")))
    assert reuse_pays(cfg, NS(size=1), NS(tier="host", device=torch.device("cuda", 0)))
