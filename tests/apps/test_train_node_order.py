"""Training in another node order trains the same model: the file's order (mgg.prepare
--reorder-nodes), an in-memory order (mgg.train --reorder-nodes) and the input order give the
same losses to float rounding (dropout 0: dropout masks follow node ids), and a bad order request
is one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mgg.apps.prepare_cli import main as prepare
from mgg.data.npz import load_npz, save_npz
from mgg.testing.communities import shuffled_communities
from mgg.train import main as train


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A 1,600-node graph of 8 shuffled communities, labels = community, no masks (seeded split)."""
    g, _ = shuffled_communities(k=8, size=200, degree=10, cross=0.2, seed=4)
    path = tmp_path_factory.mktemp("order") / "native.npz"
    save_npz(g, path)
    return path


def _losses(tmp_path, dataset, *flags) -> list[float]:
    out = tmp_path / "m.json"
    assert train(["--dataset", str(dataset), "--epochs", "6", "--backend", "cpu", "--dropout", "0", "--no-progress",
                  "--metrics-json", str(out), *flags]) == 0
    doc = json.loads(out.read_text())
    return [e["loss"] for e in doc["epochs"]]


@pytest.mark.parametrize("model", ["gcn", "gin"])
@pytest.mark.parametrize("method", ["metis", "cluster"])
def test_a_relabelled_file_trains_the_input_orders_model(tmp_path, native, model, method):
    if method == "metis":
        pytest.importorskip("pymetis")
    out = tmp_path / "relabelled.npz"
    assert prepare([str(native), "--out", str(out), "--reorder-nodes", method]) == 0
    g = load_npz(out)
    assert g.user_ids is not None and not np.array_equal(g.user_ids, np.arange(g.num_nodes))
    want = _losses(tmp_path, native, "--model", model, "--reorder-nodes", "none")
    got = _losses(tmp_path, out, "--model", model)  # default flags: the file's order is kept
    in_memory = _losses(tmp_path, native, "--model", model, "--reorder-nodes", method)
    # float32 rounding of another summation order; GIN's two batch norms a layer and Adam grow it
    # (up to 1.2e-3 relative here; a wrong aggregation moves the loss by 1e-1)
    rtol = 2e-5 if model == "gcn" else 5e-3
    np.testing.assert_allclose(got, want, rtol=rtol)
    np.testing.assert_allclose(in_memory, want, rtol=rtol)


def test_a_relabelled_file_relabelled_again_still_trains_the_same_model(tmp_path, native):
    once = tmp_path / "once.npz"
    assert prepare([str(native), "--out", str(once), "--reorder-nodes", "degree"]) == 0
    want = _losses(tmp_path, native, "--reorder-nodes", "none")
    np.testing.assert_allclose(_losses(tmp_path, once, "--reorder-nodes", "cluster"), want, rtol=2e-5)


def test_metis_without_pymetis_is_one_line(tmp_path, native, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "pymetis", None)
    with pytest.raises(SystemExit) as e:
        train(["--dataset", str(native), "--epochs", "1", "--backend", "cpu", "--reorder-nodes", "metis"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "needs the pymetis package" in err[0]
    with pytest.raises(SystemExit) as e:
        prepare([str(native), "--out", str(tmp_path / "x.npz"), "--reorder-nodes", "metis"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "needs the pymetis package" in err[0]
    assert not (tmp_path / "x.npz").exists()


def test_a_checkpoint_of_one_order_is_refused_by_a_file_in_another(tmp_path, native, capsys):
    """Resuming on the same graph relabelled is refused (its fingerprint differs), in one line."""
    ck = tmp_path / "ck"
    assert train(["--dataset", str(native), "--epochs", "2", "--backend", "cpu", "--no-progress",
                  "--reorder-nodes", "none", "--checkpoint-dir", str(ck), "--checkpoint-every", "1"]) == 0
    out = tmp_path / "relabelled.npz"
    assert prepare([str(native), "--out", str(out), "--reorder-nodes", "cluster"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train(["--dataset", str(out), "--epochs", "4", "--backend", "cpu", "--no-progress",
               "--checkpoint-dir", str(ck), "--resume", "auto"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "graph fingerprint" in err[0]


@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_auto_relabels_graphs_built_in_memory_and_prepares_them_in_the_new_order(tmp_path, native, mode,
                                                                                   monkeypatch):
    """auto: a memory-mapped file (full-graph mode) keeps its order; a graph loaded whole (sampled
    mode) without locality is relabelled, and its node data is prepared in the new order."""
    import mgg.apps.node_order as node_order
    from mgg.runtime import Communicator
    from mgg.train import TrainConfig, _load

    monkeypatch.setattr(node_order, "AUTO_MIN_NODES", 500)  # the test graph's 1,600 nodes count
    cfg = TrainConfig(dataset=str(native), mode=mode, backend="cpu", progress=False)
    graph, prep = _load(cfg, Communicator(comm=None))
    if mode == "full":
        assert graph.user_ids is None
        return
    orig = load_npz(native)
    assert graph.user_ids is not None
    np.testing.assert_array_equal(prep.y, orig.y[graph.user_ids])
    np.testing.assert_array_equal(prep.x, orig.x[graph.user_ids])
