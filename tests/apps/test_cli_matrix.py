"""The training CLI over every registered model x {full, --tune, --mode sampled}, generated from
the model registry (mgg.nn.registry): a supported combination trains karate for 3 epochs on the
CPU (in-process, through `mgg.apps.cli.main`), an unsupported one is refused with exit 2 and a
one-line error naming the flags."""
import json
import math
import subprocess
import sys

import pytest

from mgg.apps.cli import build_parser, main
from mgg.data import load_dataset, prepare_graph
from mgg.nn import MODEL_DEFAULTS, MODELS, SAMPLED_MODELS
from mgg.nn.registry import ModelDefaults, model_entry, model_names, register_model
from mgg.testing.processes import PROCESS_TIMEOUT_S
from mgg.testing.paths import ROOT

EPOCHS = 3
BASE = ["--dataset", "karate", "--epochs", str(EPOCHS), "--backend", "cpu", "--no-progress"]
SETTINGS = {
    "full": [],
    "tune": ["--tune", "--tune-cache", "none"],
    "sampled": ["--mode", "sampled", "--fanout", "3,3", "--batch-size", "8"],
}


def supported(name: str, setting: str) -> bool:
    entry = model_entry(name)
    return {"full": True, "tune": entry.supports_tune, "sampled": entry.supports_sampled}[setting]


CASES = [pytest.param(name, setting, id=f"{name}-{setting}") for name in model_names() for setting in SETTINGS]


def run_main(argv, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the CLI run in this process."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def karate_mask_sizes():
    prep = prepare_graph(load_dataset("karate"), 0)
    return {"train_acc": int(prep.train.sum()), "val_acc": int(prep.val.sum()), "test_acc": int(prep.test.sum())}


@pytest.mark.parametrize("name,setting", CASES)
def test_cli_matrix(name, setting, tmp_path, capsys, karate_mask_sizes):
    metrics = tmp_path / "m.json"
    code, out, err = run_main(BASE + ["--model", name, *SETTINGS[setting], "--metrics-json", str(metrics)], capsys)
    if not supported(name, setting):
        assert code == 2, (code, err)
        assert "Traceback" not in err and not metrics.exists()
        errors = [ln for ln in err.splitlines() if "error" in ln]
        assert len(errors) == 1, err  # one line (argparse prints its usage above it)
        flag = "--tune" if setting == "tune" else "--mode sampled"
        assert flag in errors[0] and f"--model {name}" in errors[0], errors[0]
        return
    assert code == 0, err
    assert f"model={name} " in out and "final_loss=" in out, out
    doc = json.loads(metrics.read_text())
    assert doc["model"] == name and doc["mode"] == ("sampled" if setting == "sampled" else "full")
    assert len(doc["epochs"]) == EPOCHS and doc["tuner"]["enabled"] == (setting == "tune")
    assert all(math.isfinite(rec["loss"]) and rec["loss"] > 0 for rec in doc["epochs"])
    assert doc["final_loss"] == doc["epochs"][-1]["loss"]
    for key, n in karate_mask_sizes.items():  # an accuracy is a count of correct nodes over the mask size
        acc = doc[key]
        assert 0.0 <= acc <= 1.0, (key, acc)
        assert abs(acc * n - round(acc * n)) < 1e-9, (key, acc, n)


def test_parser_offers_exactly_the_registered_models():
    action = next(a for a in build_parser()._actions if a.dest == "model")
    assert tuple(action.choices) == model_names()
    assert set(MODELS) == set(MODEL_DEFAULTS) == set(model_names())
    assert set(SAMPLED_MODELS) == {n for n in model_names() if model_entry(n).supports_sampled}
    for name in model_names():
        assert MODELS[name] is model_entry(name).model and MODEL_DEFAULTS[name] is model_entry(name).defaults


def test_registry_refuses_inconsistent_entries():
    d = ModelDefaults(hidden=4, layers=2, dropout=0.0, lr=0.01, weight_decay=0.0)
    with pytest.raises(ValueError, match="already registered"):
        register_model("gcn", object, aggregation="gcn", defaults=d)
    with pytest.raises(ValueError, match="aggregation"):
        register_model("x-bad-kind", object, aggregation="max", defaults=d)
    with pytest.raises(ValueError, match="tuning needs a plan aggregation"):
        register_model("x-bad-tune", object, aggregation=None, defaults=d, supports_tune=True)
    assert "x-bad-kind" not in model_names() and "x-bad-tune" not in model_names()


@pytest.mark.slow
def test_gat_tune_is_refused_by_the_command(tmp_path):
    """python -m mgg.train --model gat --tune --epochs 3 is refused with one line, not a KeyError."""
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_MCA_osc="^ucx", CI="true")
    r = subprocess.run([sys.executable, "-m", "mgg.train", "--model", "gat", "--tune", "--epochs", "3",
                        "--dataset", "karate", "--backend", "cpu"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("error: --tune") and "--model gat" in r.stderr
