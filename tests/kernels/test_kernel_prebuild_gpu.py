"""A GPU training run builds its CUDA kernels before the first epoch: every module (and part) it
loads is among those its configuration predicted (mgg.apps.kernel_prebuild), so none compiles on
first use inside the first epoch. Each run trains in its own process (`python -m mgg.train`) and
reports the modules it prebuilt and loaded in the metrics JSON; the runs share the per-user cache."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from mgg.testing.processes import MPIRUN, subprocess_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: reddit-like at 0.3: 70K rows a rank at P = 1, above the tall-GEMM threshold (65,536 rows)
DATA = ["--dataset", "reddit-like", "--scale", "0.3", "--epochs", "2", "--backend", "gpu"]

CONFIGS = {
    "gcn": ["--model", "gcn"],
    "gin": ["--model", "gin"],
    "sage": ["--model", "sage"],
    "gat": ["--model", "gat", "--scale", "0.05"],
    "gcn-bf16": ["--model", "gcn", "--storage-dtype", "bf16"],
    "gcn-tune": ["--model", "gcn", "--tune", "--tune-cache", "none"],
    "sage-sampled": ["--model", "sage", "--mode", "sampled"],
}


def _train(flags: list[str], tmp_path, ranks: int = 1) -> dict:
    out = tmp_path / "metrics.json"
    cmd = [sys.executable, "-m", "mgg.train", *DATA, *flags, "--metrics-json", str(out)]
    if ranks > 1:
        cmd = [*MPIRUN, "-np", str(ranks), *cmd]
    r = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _check(doc: dict) -> None:
    k = doc["kernels"]
    assert k["prebuilt"] and k["loaded"], k
    assert set(k["loaded"]) <= set(k["prebuilt"]), f"loaded but not prebuilt: {set(k['loaded']) - set(k['prebuilt'])}"
    assert "build" in doc["phases"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_run_loads_only_the_kernels_it_prebuilt(name, tmp_path):
    _check(_train(CONFIGS[name], tmp_path))


@pytest.mark.skipif(torch.cuda.device_count() < 2 or shutil.which("mpirun") is None,
                    reason="needs two GPUs and mpirun")
@pytest.mark.parametrize("name", ["gcn", "gin", "gat"])
def test_two_ranks_load_only_the_kernels_they_prebuilt(name, tmp_path):
    doc = _train(CONFIGS[name], tmp_path, ranks=2)
    _check(doc)
    assert "aggregate" in doc["kernels"]["prebuilt"]  # other GPUs' rows
