"""Row sets (mgg.runtime.rowset): the aggregation and the models on a subset of output rows,
against the float64 reference and against the full computation (P = 1; P > 1 in tests/graph/test_runtime_mpi.py)."""
import numpy as np
import pytest
import torch

from mgg.nn import build_model
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig
from mgg.testing.reference import aggregation_matrix
from mgg.testing.graphs import random_csr


def _graph(n=300, e=2600, seed=4):
    indptr, indices = random_csr(n, e, seed=seed)
    rows = np.sort(np.random.default_rng(seed).choice(n, n // 7, replace=False))
    return indptr, indices, rows


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
def test_rows_match_the_float64_reference_both_directions(kind):
    indptr, indices, rows = _graph()
    n = len(indptr) - 1
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    g = np.zeros((n, 5), np.float32)
    g[rows] = rng.standard_normal((len(rows), 5))  # what the backward of out[S] passes
    w = aggregation_matrix(indptr, indices, kind)
    ws = w[rows]  # the rows of S: W_S
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(4, 2, 2, backend="cpu")) as dg:
        rs = dg.register_rows("s", torch.from_numpy(rows))
        full = dg.aggregate(torch.from_numpy(x), kind)
        out = dg.aggregate(torch.from_numpy(x), kind, rows=rs)
        back = dg.aggregate(torch.from_numpy(g), kind, transposed=True, rows="s")
        assert dg.plan(kind, rows="s").num_local_edges < dg.plan(kind).num_local_edges
    assert len(rs) == rs.num_global == len(rows)
    np.testing.assert_allclose(out[rs.index].numpy(), ws @ x.astype(np.float64), rtol=1e-5, atol=1e-5)
    assert torch.equal(out[rs.index], full[rs.index])  # the full path's order: same bits
    ref_back = ws.T @ g[rows].astype(np.float64)
    np.testing.assert_allclose(back.numpy(), ref_back, rtol=1e-5, atol=1e-5)


def test_register_rows_errors():
    indptr, indices, _ = _graph(40, 200)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        with pytest.raises(ValueError, match="row 40 is outside"):
            dg.register_rows("s", np.array([3, 40]))
        dg.register_rows("s", np.array([5, 3, 3]))
        with pytest.raises(ValueError, match="exists"):
            dg.register_rows("s", np.array([1]))
        with pytest.raises(KeyError, match="no row set named 't'"):
            dg.plan("sum", rows="t")
        dg.plan("sum")
        with pytest.raises(RuntimeError, match="before the first plan"):
            dg.register_rows("t", np.array([1]))


def _step(model, dg, x, y, rows, rs):
    model.zero_grad()
    logits = model(x, dg, None, rows=rs) if rs is not None else model(x, dg, None)[rows]
    loss = torch.nn.functional.cross_entropy(logits, y[rows])
    loss.backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name,opts", [("gcn", {}), ("gin", {"norm": "none"}), ("gin", {"norm": "batch"}),
                                        ("sage", {}), ("gat", {})])
def test_models_on_rows_equal_the_full_forward_and_backward(name, opts):
    indptr, indices, rows = _graph()
    n = len(indptr) - 1
    torch.manual_seed(0)
    x = torch.randn(n, 12)
    y = torch.randint(0, 5, (n,))
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        rs = dg.register_rows("train", torch.from_numpy(rows))
        model = build_model(name, 12, 8, 5, 2, 0.0, **opts)
        want_logits, want_grads = _step(model, dg, x, y, torch.from_numpy(rows), None)
        logits, grads = _step(model, dg, x, y, torch.from_numpy(rows), rs)
    assert logits.shape == (len(rows), 5)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_gin_with_batch_norm_writes_only_the_rows_after_the_last_norm(monkeypatch):
    """The last GIN layer with batch norm aggregates and normalises every row (all-row
    statistics) but its norm writes only the rows read (`rows=`), and the Linear after it runs
    on them alone; the inner layers still run on every row. Equal to the full model (above)."""
    from mgg.nn.norm import DistBatchNorm

    seen = []
    orig = DistBatchNorm.forward

    def spy(self, x, dg=None, relu=False, rows=None):
        seen.append((x.shape[0], None if rows is None else len(rows)))
        return orig(self, x, dg, relu, rows)

    monkeypatch.setattr(DistBatchNorm, "forward", spy)
    indptr, indices, rows = _graph()
    n = len(indptr) - 1
    torch.manual_seed(0)
    x, y = torch.randn(n, 12), torch.randint(0, 5, (n,))
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        rs = dg.register_rows("train", torch.from_numpy(rows))
        model = build_model("gin", 12, 8, 5, 3, 0.0, norm="batch")
        logits, _ = _step(model, dg, x, y, torch.from_numpy(rows), rs)
    assert logits.shape == (len(rows), 5)
    assert seen == [(n, None)] * 4 + [(n, len(rows))]  # inner layers: MLP norm + norm after the conv
    with pytest.raises(ValueError, match="compact=True"):
        model.convs[0](x, dg, rows=rs, compact=False)


def test_cli_uses_row_sets_when_the_training_rows_are_few(tmp_path):
    """papers-like keeps ~1% of the nodes in its masks: the run registers the row sets of both
    layers (the last layer's rows, and the first layer's: those and their in-neighbours) for the
    loss and the evaluation, and its losses equal those of the same run without them."""
    import json

    from mgg.train import main

    def run(flags: list[str], out):
        assert main(["--dataset", "papers-like", "--scale", "0.002", "--epochs", "3", "--backend", "cpu",
                     "--no-progress", "--metrics-json", str(out), *flags]) == 0
        return json.loads(out.read_text())

    with_sets, without = run([], tmp_path / "a.json"), run(["--no-row-sets"], tmp_path / "b.json")
    n = with_sets["num_nodes"]
    sets = with_sets["row_sets"]
    assert set(sets) == {"train", "train.0", "eval", "eval.0"} and "row_sets" not in without
    assert 0 < sets["train"] < sets["eval"] < 0.05 * n  # the last layer's rows
    assert sets["train"] < sets["train.0"] <= 0.5 * n and sets["eval"] < sets["eval.0"] <= 0.5 * n  # + in-neighbours
    print(sets, n)
    np.testing.assert_allclose([e["loss"] for e in with_sets["epochs"]], [e["loss"] for e in without["epochs"]],
                               rtol=1e-5)
    assert with_sets["test_acc"] == pytest.approx(without["test_acc"])


def test_expand_rows_adds_the_in_neighbours():
    indptr, indices, rows = _graph(200, 900, seed=8)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        rs = dg.register_rows("s", rows)
        wide = dg.expand_rows(rs, "s.0")
    want = set(rows.tolist())
    for r in rows:
        want |= set(indices[indptr[r]:indptr[r + 1]].tolist())
    assert wide.index.tolist() == sorted(want) and wide.num_global == len(want)


@pytest.mark.parametrize("name,opts", [("gcn", {}), ("sage", {}), ("gin", {"norm": "none"}),
                                        ("gin", {"norm": "batch"})])
@pytest.mark.parametrize("layers", [2, 3])
def test_models_on_layer_row_sets_equal_the_full_forward_and_backward(name, opts, layers):
    """Every layer computes only the rows the next one reads (register_layer_rows): the logits
    and every gradient equal the full model's (batch norm across rows: nothing restricted)."""
    indptr, indices, rows = _graph(400, 2400, seed=5)
    torch.manual_seed(0)
    x, y = torch.randn(400, 12), torch.randint(0, 5, (400,))
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        sets = dg.register_layer_rows("train", rows, layers)
        assert all(s is not None for s in sets) and sets[0].num_global > sets[-1].num_global
        model = build_model(name, 12, 8, 5, layers, 0.0, **opts)
        want_logits, want_grads = _step(model, dg, x, y, torch.from_numpy(rows), None)
        logits, grads = _step(model, dg, x, y, torch.from_numpy(rows), sets)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_register_layer_rows_stops_at_the_share():
    indptr, indices, rows = _graph(300, 4000, seed=2)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        sets = dg.register_layer_rows("t", rows[:5], 3, max_share=0.3)
    assert sets[-1] is not None and len(sets[-1]) == 5
    assert sets[0] is None  # two hops of a dense graph cover more than 30% of it
