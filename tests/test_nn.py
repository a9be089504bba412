"""mgg.nn on one process: Aggregate's gradient, each layer against a dense float64 formula."""
import numpy as np
import pytest
import torch

from mgg.testing.reference import aggregation_matrix
from mgg.nn import GCNConv, GINConv, SAGEConv, aggregate, build_model, global_dropout, model_names
from mgg.runtime import Communicator, DistGraph, RuntimeConfig
from tests.graphs import random_csr


def make_dg(n=40, e=160, seed=0, ps=4):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(ps=ps, dist=2, wpb=2, backend="cpu"))
    return dg, indptr, indices


def dense(indptr, indices, kind):
    return torch.from_numpy(aggregation_matrix(indptr, indices, kind).toarray())


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_aggregate_gradcheck(kind, seed):
    dg, indptr, indices = make_dg(n=25, e=90, seed=seed)
    x = torch.randn(dg.n_local, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: aggregate(t, dg, kind), (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn"])
def test_aggregate_forward_backward_match_dense(kind):
    dg, indptr, indices = make_dg(seed=3)
    w = dense(indptr, indices, kind)
    x = torch.randn(dg.n_local, 5, requires_grad=True)
    g = torch.randn(dg.n_local, 5)
    out = aggregate(x, dg, kind)
    out.backward(g)
    assert torch.allclose(out.double(), w @ x.double(), atol=1e-5)
    assert torch.allclose(x.grad.double(), w.T @ g.double(), atol=1e-5)


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_gcn_conv_dense(fin, fout):
    dg, indptr, indices = make_dg(seed=4)
    conv = GCNConv(fin, fout)
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(dg.n_local, fin)
    w = dense(indptr, indices, "gcn")
    ref = w @ x.double() @ conv.lin.weight.double().T + conv.bias.double()
    assert torch.allclose(conv(x, dg).double(), ref, atol=1e-5)


def test_gin_conv_dense_and_eps_grad():
    dg, indptr, indices = make_dg(seed=5)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    conv = GINConv(mlp, eps=0.3, train_eps=True)
    x = torch.randn(dg.n_local, 4)
    out = conv(x, dg)
    w = dense(indptr, indices, "sum")
    h = 1.3 * x.double() + w @ x.double()
    ref = mlp.double()(h)
    mlp.float()
    assert torch.allclose(out.double(), ref, atol=1e-4)
    out.square().sum().backward()
    assert conv.eps.grad is not None and conv.eps.grad.abs().item() > 0


def test_gin_fixed_eps_is_buffer():
    conv = GINConv(torch.nn.Linear(2, 2), eps=0.1, train_eps=False)
    assert "eps" not in dict(conv.named_parameters())


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_sage_conv_dense(fin, fout):
    dg, indptr, indices = make_dg(seed=6)
    conv = SAGEConv(fin, fout)
    x = torch.randn(dg.n_local, fin)
    w = dense(indptr, indices, "mean")
    xd = x.double()
    ref = (w @ xd) @ conv.lin_l.weight.double().T + conv.lin_l.bias.double() + xd @ conv.lin_r.weight.double().T
    assert torch.allclose(conv(x, dg).double(), ref, atol=1e-5)


@pytest.mark.parametrize("name", model_names())  # every registered model
def test_models_backward_reaches_every_parameter(name):
    dg, _, _ = make_dg(seed=7)
    model = build_model(name, 5, 8, 3, layers=None, dropout=0.5)
    gen = torch.Generator().manual_seed(0)
    out = model(torch.randn(dg.n_local, 5), dg, gen)
    assert out.shape == (dg.n_local, 3)
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname


def test_global_dropout_is_partition_independent():
    dg, _, _ = make_dg(n=30)
    x = torch.ones(dg.n_local, 4)
    a = global_dropout(x, 0.5, dg, torch.Generator().manual_seed(1))
    b = global_dropout(x, 0.5, dg, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(global_dropout(x, 0.5, dg, None, training=False), x)


def test_build_model_rejects_unknown():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("foo", 3, 4, 2)
