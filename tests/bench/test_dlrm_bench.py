"""bench/dlrm.py in one process: mgg's DLRM step and the torch.distributed all-to-all design both
train the float64 single-process DLRM (mgg.testing.dlrm_reference), the bench refuses to time
designs whose losses disagree, and its command line writes the table and the JSON."""
import json
import subprocess
import sys

import pytest
import torch

from bench import dlrm as bench_dlrm
from bench.dlrm_a2a import AllToAllDLRM
from mgg.embedding.dlrm_data import DLRMBatches
from mgg.embedding.dlrm_model import DLRMConfig
from mgg.embedding.dlrm_train import MggDLRM
from mgg.graph import make_store
from mgg.testing.dlrm_reference import ReferenceDLRM, assert_trained_like
from mgg.testing.paths import ROOT
from mgg.testing.processes import PROCESS_TIMEOUT_S, subprocess_env

CFG = DLRMConfig(cards=(50, 7, 300, 3, 1000), dim=4, bot=(8,), top=(16, 1), zipf=1.05, lr=0.5, emb_lr=0.3, seed=5)
B, STEPS = 32, 4


def test_both_designs_train_the_float64_reference(gloo):
    comm = gloo
    designs = {"mgg": MggDLRM(CFG, comm, make_store(comm, "cpu")), "a2a": AllToAllDLRM(CFG, torch.device("cpu"))}
    ref = ReferenceDLRM(CFG, B, comm.size)
    want = [ref.step() for _ in range(STEPS)]
    assert want[-1] < want[0]  # the reference learns: the check below compares a moving target
    try:
        for name, m in designs.items():
            got = bench_dlrm.run_steps(m, DLRMBatches(CFG, B, comm.rank), STEPS, torch.device("cpu"), comm)
            assert_trained_like(m, ref, got, want, name)
    finally:
        designs["mgg"].free()


def test_losses_disagree_names_the_first_differing_step():
    assert bench_dlrm.losses_disagree([0.7, 0.69], [0.7, 0.69 * (1 + 1e-7)], 1e-5) is None
    msg = bench_dlrm.losses_disagree([0.7, 0.69, 0.5], [0.7, 0.68, 0.5], 1e-5)
    assert msg is not None and msg.startswith("step 2:")
    assert bench_dlrm.losses_disagree([0.7], [float("nan")], 1e-5) is not None


def test_a_design_that_trains_differently_gets_no_timings(monkeypatch, capsys):
    monkeypatch.setattr(AllToAllDLRM, "_adagrad", lambda self, rows, grad: None)  # tables never updated
    rc = bench_dlrm.main(["--max-rows", "500", "--tables", "4", "--batch-size", "64", "--steps", "2",
                          "--emb-lr", "1.0"])
    out = capsys.readouterr()
    assert rc == 1
    assert "do not train the same model" in out.err and "step 2:" in out.err
    assert "step ms" not in out.out and "a2a/mgg" not in out.out


@pytest.mark.slow
def test_command_line_prints_the_table_and_writes_the_json(tmp_path):
    out = tmp_path / "dlrm.json"
    r = subprocess.run([sys.executable, "bench/dlrm.py", "--max-rows", "500", "--tables", "6", "--batch-size", "64",
                        "--steps", "3", "--warmup", "1", "--json", str(out)], cwd=ROOT, env=subprocess_env(),
                       capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "a2a/mgg" in r.stdout and "torchrec" in r.stdout
    res = json.loads(out.read_text())
    assert res["P"] == 1 and res["tables"] == [500, 500, 500, 500, 305, 24]
    assert res["check_losses"]["mgg"] == pytest.approx(res["check_losses"]["a2a"], rel=1e-4)
    assert len(res["step_s"]["mgg"]) == len(res["step_s"]["a2a"]) == 3
    assert res["ratio_a2a_over_mgg"] == pytest.approx(res["median_s"]["a2a"] / res["median_s"]["mgg"])
    assert res["torchrec"]["run"] is False and res["torchrec"]["reason"]
    assert res["graph"]["captured"] is False and "CPU store" in res["graph"]["why_eager"]  # eager on the CPU
    assert "mgg step: eager" in r.stdout
