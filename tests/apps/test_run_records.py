"""What a training run leaves behind: per-epoch JSON lines (and TensorBoard scalars) written as
it goes, weights for mgg.predict / mgg.export, settings read back with --config, and mgg's
logging lines shown by the apps' handler."""
import importlib.util
import io
import json
import logging

import numpy as np
import pytest

from mgg.apps.args import parse_args
from mgg.apps.log_setup import install_log_handler
from mgg.export import main as export_main
from mgg.predict import main as predict_main
from mgg.prepare import main as prepare_main
from mgg.train import main as train_main

BASE = ["--backend", "cpu", "--no-progress"]


def _lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_jsonl_log_has_every_epoch_and_its_config_starts_a_run(tmp_path):
    log, metrics = tmp_path / "run.jsonl", tmp_path / "m.json"
    assert train_main(["--model", "gin", "--epochs", "4", "--hidden", "8", "--layers", "3", "--eval-every", "2",
                       "--log-jsonl", str(log), "--metrics-json", str(metrics), *BASE]) == 0
    lines = _lines(log)
    assert [d["event"] for d in lines] == ["start"] + ["epoch"] * 4 + ["end"]
    doc = json.loads(metrics.read_text())
    epochs = [d for d in lines if d["event"] == "epoch"]
    for rec, want in zip(epochs, doc["epochs"]):  # the same records as the metrics JSON, as they happened
        assert rec["epoch"] == want["epoch"] and rec["loss"] == want["loss"] and rec["val_acc"] == want["val_acc"]
    assert epochs[0]["test_acc"] is None and epochs[-1]["test_acc"] == doc["test_acc"]
    resolved_in_the_loop = {"cuda_graph"}  # None (where it applies) in the CLI's config, decided by the loop
    assert {k: v for k, v in lines[0]["config"].items() if k not in resolved_in_the_loop} == \
        {k: v for k, v in doc["config"].items() if k not in resolved_in_the_loop}
    # --config takes either file back; flags given win; per-run paths are not carried over
    for src in (metrics, log):
        cfg = parse_args(["--config", str(src), "--epochs", "2"])
        assert (cfg.model, cfg.hidden, cfg.layers, cfg.eval_every, cfg.epochs) == ("gin", 8, 3, 2, 2)
        assert cfg.metrics_json is None and cfg.log_jsonl is None


def test_config_file_errors_name_the_file(tmp_path, capsys):
    p = tmp_path / "c.json"
    for text, needle in (('{"epochs": -3}', "argument --epochs: must be an integer >= 1"),
                         ('{"modle": "gin"}', "unknown setting 'modle'"), ("[1, 2]", "expected a JSON object"),
                         ("{nope", "not JSON")):
        p.write_text(text)
        with pytest.raises(SystemExit) as e:
            parse_args(["--config", str(p)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--config {p}" in err and needle in err, err


def test_quiet_and_verbose_flags():
    assert parse_args(["-q"]).verbosity == -1 and parse_args(["-q"]).progress is False
    assert parse_args(["-vv"]).verbosity == 2 and parse_args([]).progress is True


def test_tuner_lines_reach_the_handler_on_rank_0_only():
    out = io.StringIO()
    install_log_handler(0, rank=0, size=2, stream=out)
    logging.getLogger("mgg.tuner").info("tuner: done after 12 measurements")
    logging.getLogger("mgg.tuner").debug("hidden at the default verbosity")
    assert out.getvalue() == "tuner: done after 12 measurements\n"
    other = io.StringIO()
    install_log_handler(0, rank=1, size=2, stream=other)
    logging.getLogger("mgg.tuner").info("not on rank 1")
    logging.getLogger("mgg.tuner").warning("cache unreadable")
    assert other.getvalue() == "rank 1 of 2: cache unreadable\n"
    verbose = io.StringIO()
    install_log_handler(1, rank=0, size=1, stream=verbose)
    logging.getLogger("mgg.data").debug("detail")
    assert verbose.getvalue() == "detail\n"
    install_log_handler(0)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_scalars_per_epoch(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    assert train_main(["--epochs", "3", "--tensorboard", str(tb), *BASE]) == 0
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3]
    assert {"train_acc", "val_acc", "epoch_ms"} <= set(acc.Tags()["scalars"])


def test_predict_in_the_users_ids_after_a_reordered_file(tmp_path, capsys):
    """Weights trained on a relabelled file predict on it; the rows come back in the original
    node ids, equal to predicting on the original file with the same weights."""
    orig, reordered = tmp_path / "g.npz", tmp_path / "g_deg.npz"
    assert prepare_main(["sbm", "--scale", "0.03", "--out", str(orig)]) == 0
    assert prepare_main([str(orig), "--out", str(reordered), "--reorder-nodes", "degree"]) == 0
    assert np.load(reordered)["user_ids"].shape == (np.load(orig)["indptr"].shape[0] - 1,)  # the map back
    w, ck = tmp_path / "w.pt", tmp_path / "ck"
    assert train_main(["--dataset", str(reordered), "--epochs", "3", "--save-weights", str(w),
                       "--checkpoint-dir", str(ck), *BASE]) == 0
    a, b, c = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    for ds, out, weights in ((reordered, a, w), (orig, b, w), (orig, c, ck / "checkpoint.mgg")):
        assert predict_main(["--dataset", str(ds), "--weights", str(weights), "--out", str(out),
                             "--backend", "cpu", "--embeddings"]) == 0
    pa, pb, pc = np.load(a), np.load(b), np.load(c)
    np.testing.assert_allclose(pa["logits"], pb["logits"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(pb["logits"], pc["logits"])  # the checkpoint holds the same weights
    assert pa["embeddings"].shape == (pa["logits"].shape[0], 16)  # GCN's hidden width
    np.testing.assert_array_equal(pb["pred"], pb["logits"].argmax(1))
    np.testing.assert_array_equal(pb["node_id"], np.arange(len(pb["pred"])))
    with pytest.raises(SystemExit) as e:  # an existing output is kept
        predict_main(["--dataset", str(orig), "--weights", str(w), "--out", str(b), "--backend", "cpu"])
    assert e.value.code == 2 and "exists" in capsys.readouterr().err


def test_predict_refuses_weights_of_another_width(tmp_path, capsys):
    w = tmp_path / "w.pt"
    assert train_main(["--epochs", "1", "--save-weights", str(w), *BASE]) == 0  # karate: 34 features
    with pytest.raises(SystemExit) as e:
        predict_main(["--dataset", "sbm", "--scale", "0.01", "--weights", str(w), "--out", str(tmp_path / "p.npz")])
    assert e.value.code == 2
    assert "the weights take 34 input features, the graph has" in capsys.readouterr().err


def test_export_cli_writes_a_pyg_loadable_file(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert train_main(["--model", "sage", "--epochs", "1", "--checkpoint-dir", str(ck), *BASE]) == 0
    out = tmp_path / "sage.pt"
    assert export_main([str(ck), str(out)]) == 0
    assert "torch_geometric.nn.models.GraphSAGE(in_channels=34" in capsys.readouterr().out
    import torch

    sd = torch.load(out, weights_only=True)
    assert "convs.0.lin_l.weight" in sd
    with pytest.raises(SystemExit):
        export_main([str(ck), str(out)])  # exists
    assert "pass --force" in capsys.readouterr().err
