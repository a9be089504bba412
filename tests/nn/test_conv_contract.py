"""The conv contract (mgg.nn.conv.base.GraphConv): its defaults, GNN's use of the hooks a conv
declares, and a convolution written outside mgg running in a GNN unchanged -- against dense
float64 math."""
import pytest
import torch
from torch import nn

from mgg.graph import DistGraph, RuntimeConfig
from mgg.nn import GNN, GraphConv, aggregate, build_model, model_names
from mgg.runtime import Communicator
from mgg.testing.reference import aggregation_matrix
from mgg.testing.graphs import random_csr


def make_dg(n=40, e=160, seed=0):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(ps=4, dist=2, wpb=2, backend="cpu"))
    return dg, torch.from_numpy(aggregation_matrix(indptr, indices, "sum").toarray())


class SumConv(GraphConv):
    """out = lin(sum_{j -> i} x_j): a convolution that declares no hook."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels)
        self.calls: list[tuple[str, dict]] = []

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()

    def forward(self, x, dg, **kw):
        self.calls.append(("forward", kw))
        out = self.lin(aggregate(x, dg, "sum"))
        return torch.relu(out) if kw.get("relu_out") else out


class FusingSumConv(SumConv):
    """SumConv that declares two hooks: the ReLU inside, and a start from the input's sum."""

    takes_relu_out = True

    def input_aggregation(self):
        return "sum", None

    def forward_aggregated(self, agg, x, dg, **kw):
        self.calls.append(("forward_aggregated", kw))
        out = self.lin(agg)
        return torch.relu(out) if kw.get("relu_out") else out


def _dense_stack(convs, w, x):
    """float64 W relu(W x W1^T + b1) W2^T + b2 of two SumConvs."""
    (w1, b1), (w2, b2) = [(c.lin.weight.detach().double(), c.lin.bias.detach().double()) for c in convs]
    h = torch.relu(w @ x.double() @ w1.T + b1)
    return w @ h @ w2.T + b2


def test_graph_conv_declares_every_hook_with_its_default():
    c = GraphConv()
    assert (c.supports_rows, c.supports_output_rows, c.takes_relu_out, c.takes_epilogue) == (False,) * 4
    assert c.input_aggregation() is None and c.first_weight is None and c.input_scale(None) is None
    dg, _ = make_dg()
    with pytest.raises(NotImplementedError, match="GraphConv defines no forward"):
        c(torch.zeros(dg.n_local, 2), dg)
    with pytest.raises(NotImplementedError, match="no first weight"):
        c.forward_projected(torch.zeros(dg.n_local, 2), dg)


def test_every_registered_model_is_a_stack_of_graph_convs():
    for name in model_names():
        m = build_model(name, 6, None, 3)
        assert all(isinstance(c, GraphConv) for c in m.convs), name


def test_gnn_refuses_a_layer_that_is_not_a_graph_conv():
    with pytest.raises(TypeError, match="GraphConv"):
        GNN([nn.Linear(4, 4)], dropout=0.0)


def test_a_conv_without_hooks_runs_in_a_gnn_as_dense_math():
    """Dropout 0: forward is W relu(W x W1^T + b1) W2^T + b2, each step on its own; GNN passes
    no fusion keyword to a conv that declares none."""
    dg, w = make_dg(seed=1)
    torch.manual_seed(0)
    convs = [SumConv(5, 8), SumConv(8, 3)]
    m = GNN(convs, dropout=0.0)
    x = torch.randn(dg.n_local, 5)
    out = m(x, dg)
    assert torch.allclose(out.double(), _dense_stack(convs, w, x), atol=1e-4)
    assert [c.calls for c in convs] == [[("forward", {})], [("forward", {})]]


def test_gnn_uses_the_hooks_a_conv_declares():
    """The hidden conv gets relu_out=True (the last none), and in eval the first one starts from
    the input's cached sum (forward_aggregated); the values stay those of dense math."""
    dg, w = make_dg(seed=2)
    torch.manual_seed(1)
    convs = [FusingSumConv(5, 8), FusingSumConv(8, 3)]
    m = GNN(convs, dropout=0.5).eval()
    x = torch.randn(dg.n_local, 5)
    out = m(x, dg)
    assert torch.allclose(out.double(), _dense_stack(convs, w, x), atol=1e-4)
    assert convs[0].calls == [("forward_aggregated", {"relu_out": True})]
    assert convs[1].calls == [("forward", {})]
    m.cache_input_aggregation = False
    convs[0].calls.clear()
    assert torch.allclose(m(x, dg), out, atol=1e-5)
    assert convs[0].calls == [("forward", {"relu_out": True})]
