"""The plain-torch baselines of the benchmarks compute what they claim: dense float64 math."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from bench.baselines import plain_torch_model
from mgg.data import load_dataset


def _dense_adj(g) -> np.ndarray:
    a = np.zeros((g.num_nodes, g.num_nodes))
    for t in range(g.num_nodes):
        for s in g.indices[g.indptr[t]:g.indptr[t + 1]]:
            a[t, s] += 1.0
    return a


@pytest.mark.parametrize("mname,norm", [("gcn", "none"), ("gin", "none"), ("gin", "batch"), ("sage", "none")])
@pytest.mark.parametrize("hidden", [8, 40])  # below and above karate's 34 features: either side
def test_plain_torch_model_matches_dense_float64(mname, norm, hidden):
    g = load_dataset("karate")
    torch.manual_seed(0)
    model, op = plain_torch_model(g, mname, hidden, 2, "cpu", norm=norm)
    a = _dense_adj(g)
    if mname == "gcn":
        dinv = 1.0 / np.sqrt(a.sum(1) + 1.0)
        m = dinv[:, None] * (a + np.eye(len(a))) * dinv[None, :]
    elif mname == "sage":
        m = a / np.maximum(a.sum(1), 1.0)[:, None]  # the mean; karate has no isolated node
    else:
        m = a
    x = torch.from_numpy(g.x).requires_grad_()
    out = model(x, op)
    (out ** 2).sum().backward()
    grad = x.grad.clone()

    dense = torch.from_numpy(m).to(torch.float64)

    class Dense:
        def __matmul__(self, y):
            return dense @ y

    model64 = model.double()
    x64 = torch.from_numpy(g.x).double().requires_grad_()
    ref = model64(x64, Dense())
    (ref ** 2).sum().backward()
    assert torch.allclose(out.double(), ref, atol=1e-5)
    assert torch.allclose(grad.double(), x64.grad, atol=1e-5)


@pytest.mark.parametrize("mname,norm", [("gcn", "none"), ("gin", "none"), ("gin", "batch"), ("sage", "none")])
def test_plain_torch_last_layer_on_rows_equals_the_full_model(mname, norm):
    g = load_dataset("karate")
    torch.manual_seed(0)
    model, op = plain_torch_model(g, mname, 8, 2, "cpu", norm=norm)
    idx = torch.tensor([0, 3, 7, 20, 33])
    kw = {"out_index": idx} if mname in ("gin", "sage") else {}
    x = torch.from_numpy(g.x)
    full = model(x, op)
    (full[idx] ** 2).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    part = model(x, op, op.rows(idx), **kw)
    (part ** 2).sum().backward()
    assert part.shape == (5, full.shape[1])
    torch.testing.assert_close(part, full[idx], rtol=1e-5, atol=1e-6)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-5)  # a bias before batch norm: 0 up to rounding


def test_plain_gin0_and_dropout_options():
    """train_eps=False is GIN-0 (the learnt-eps model at eps = 0); dropout acts in training only."""
    g = load_dataset("karate")
    torch.manual_seed(0)
    learnt, op = plain_torch_model(g, "gin", 8, 3, "cpu", norm="batch")
    gin0, _ = plain_torch_model(g, "gin", 8, 3, "cpu", norm="batch", train_eps=False, dropout=0.5)
    assert gin0.eps is None and not any(n.startswith("eps") for n, _ in gin0.named_parameters())
    gin0.load_state_dict({k: v for k, v in learnt.state_dict().items() if k != "eps"})
    x = torch.from_numpy(g.x)
    learnt.eval(), gin0.eval()
    torch.testing.assert_close(gin0(x, op), learnt(x, op), rtol=0, atol=0)
    gin0.train()
    torch.manual_seed(1)
    a = gin0(x, op)
    torch.manual_seed(1)
    assert torch.equal(gin0(x, op), a)  # the same draw
    learnt.train()
    assert not torch.allclose(a, learnt(x, op))  # dropout changed it


@pytest.mark.parametrize("model", ["gcn", "gin", "sage"])
def test_plain_model_cli_trains_the_model_and_reports(tmp_path, model, capsys):
    """bench/plain_model.py (bench/e2e.py's torch run): the model's defaults, a JSON line with the
    epoch time and a validation accuracy in [0, 1]."""
    import json

    from bench.plain_model import main
    from mgg.data import save_npz

    path = str(tmp_path / "g.npz")
    save_npz(load_dataset("sbm", scale=0.02), path)
    assert main(["--file", path, "--impl", "torch", "--model", model, "--epochs", "3"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["status"] == "ok", res
    assert res["median_epoch_ms"] > 0 and 0.0 <= res["val_acc"] <= 1.0


@pytest.mark.parametrize("hidden", [8, 40])
def test_plain_sage_is_the_sage_formula(hidden):
    """Plain SAGE, 2 layers: relu(M x W_l^T + b + x W_r^T), then M h W_l^T + b + h W_r^T (M the
    mean, D^-1 A), in float64 from the model's own weights, Linear on either side of M."""
    g = load_dataset("karate")
    torch.manual_seed(0)
    model, op = plain_torch_model(g, "sage", hidden, 2, "cpu")
    a = _dense_adj(g)
    m = torch.from_numpy(a / a.sum(1)[:, None])
    x = torch.from_numpy(g.x).double()
    h = x
    for i, (ll, lr) in enumerate(zip(model.lin_l, model.lin_r)):
        h = m @ h @ ll.weight.double().T + ll.bias.double() + h @ lr.weight.double().T
        h = h.relu() if i == 0 else h
    torch.testing.assert_close(model(torch.from_numpy(g.x), op).double(), h, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="torch_geometric is not installed")
@pytest.mark.parametrize("mname", ["gcn", "gin", "sage"])
def test_pyg_on_sparse_adj_t_is_the_float64_formula(mname):
    """PyG's full-batch form (bench/e2e.py's pyg-sparse run): the model on the sparse adj_t gives
    what it gives on edge_index, and both are the dense float64 formula of its own weights:
    GCN relu(A_hat x W1 + b1) -> A_hat h W2 + b2; SAGE with M = D^-1 A; GIN (eval, PyG's GIN
    model) mlp((A + I) x) per layer with the norm after each hidden layer."""
    from bench.baselines import PygModel, pyg_adjacency

    g = load_dataset("karate")
    torch.manual_seed(0)
    model = PygModel(mname, g.num_features, 8, 2, g.num_classes, norm="batch").double().eval()
    x = torch.from_numpy(g.x).double()
    adj_t = pyg_adjacency(g.indptr, g.indices, g.num_nodes, "cpu", torch.float64)
    sparse = model(x, adj_t)
    torch.testing.assert_close(sparse, model(x, torch.from_numpy(g.edge_index())), rtol=1e-12, atol=1e-12)
    a = torch.from_numpy(_dense_adj(g))
    h = x
    if mname == "gcn":
        d = (a.sum(1) + 1.0).rsqrt()
        ahat = d[:, None] * (a + torch.eye(len(a), dtype=a.dtype)) * d[None, :]
        for i, conv in enumerate(model.convs):
            h = ahat @ (h @ conv.lin.weight.T) + conv.bias
            h = h.relu() if i == 0 else h
    elif mname == "sage":
        m = a / a.sum(1)[:, None]
        for i, conv in enumerate(model.convs):
            h = m @ h @ conv.lin_l.weight.T + conv.lin_l.bias + h @ conv.lin_r.weight.T
            h = h.relu() if i == 0 else h
    else:
        def bn(mod, z):  # eval: the running statistics
            return (z - mod.running_mean) / (mod.running_var + mod.eps).sqrt() * mod.weight + mod.bias

        agg = a + torch.eye(len(a), dtype=a.dtype)
        for i, conv in enumerate(model.gin.convs):
            mlp = conv.nn
            z = (agg @ h) @ mlp.lins[0].weight.T + mlp.lins[0].bias
            z = bn(mlp.norms[0].module, z).relu()
            h = z @ mlp.lins[1].weight.T + mlp.lins[1].bias
            if i == 0:
                h = bn(model.gin.norms[0].module, h).relu()
    torch.testing.assert_close(sparse, h, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="torch_geometric is not installed")
@pytest.mark.parametrize("impl", ["pyg", "pyg-sparse"])
def test_plain_model_cli_runs_pyg_both_forms(tmp_path, impl, capsys):
    import json

    from bench.plain_model import main
    from mgg.data import save_npz

    path = str(tmp_path / "g.npz")
    save_npz(load_dataset("sbm", scale=0.02), path)
    assert main(["--file", path, "--impl", impl, "--model", "gin", "--epochs", "3"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["status"] == "ok", res
    assert res["median_epoch_ms"] > 0 and 0.0 <= res["val_acc"] <= 1.0
