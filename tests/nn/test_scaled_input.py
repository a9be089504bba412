"""The gcn column factor folded into the op producing a table: the GcnFactors value
(mgg.graph.gcn_factors), DistGraph.aggregate(factors=), aggregate(factors=) and its gradient,
global_dropout(row_scale=), GCNConv(input_scale=) and the GCN model taking it -- against dense
float64 math (CPU; the GPU's native path: tests/nn/test_scaled_input_gpu.py)."""
import numpy as np
import pytest
import torch

from mgg.nn import GCNConv, aggregate, global_dropout
from mgg.runtime import Communicator
from mgg.graph import SCALED_INPUT, WHOLE, DistGraph, GcnFactors, RuntimeConfig
from mgg.testing.reference import aggregation_matrix
from mgg.testing.graphs import random_csr


def make_dg(n=40, e=160, seed=0):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(ps=4, dist=2, wpb=2, backend="cpu"))
    return dg, indptr, indices


def _dinv64(indptr) -> np.ndarray:
    return 1.0 / np.sqrt(np.diff(indptr).astype(np.float64) + 1.0)


def test_gcn_factor_is_dinv_of_in_degrees():
    dg, indptr, _ = make_dg(seed=1)
    f = dg.gcn_factor()
    assert f.dtype == torch.float32 and f.shape == (dg.n_local,)
    assert np.allclose(f.numpy(), _dinv64(indptr), rtol=1e-7, atol=0)


def test_gcn_factors_transpose_and_scaled_input_compose():
    """The backward of diag(f)^r (A + I) diag(f)^c is diag(f)^c (A + I)^T diag(f)^r."""
    assert WHOLE.whole and WHOLE.transpose() == WHOLE
    assert not SCALED_INPUT.whole and SCALED_INPUT.transpose() == GcnFactors(row=False, column=True)
    assert WHOLE.on_scaled_input() == SCALED_INPUT
    assert SCALED_INPUT.transpose().on_scaled_input() == GcnFactors(row=False, column=False)
    assert str(WHOLE) == "diag(f) (A + I) diag(f)" and str(SCALED_INPUT) == "diag(f) (A + I)"
    assert str(GcnFactors(row=False, column=False)) == "(A + I)"


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("row,column", [(True, True), (True, False), (False, True), (False, False)])
def test_every_part_of_the_gcn_product_matches_dense(transposed, row, column):
    """aggregate(x, factors=GcnFactors(row, column)) = diag(f)^row (A + I) diag(f)^column x (its
    transpose with `transposed`), in float64 against dense math."""
    dg, indptr, indices = make_dg(seed=12)
    w = torch.from_numpy(aggregation_matrix(indptr, indices, "gcn").toarray())
    d = torch.from_numpy(_dinv64(indptr))
    a_hat = torch.round(w / d.unsqueeze(1) / d.unsqueeze(0))  # A + I
    a_hat = a_hat.T if transposed else a_hat
    x = torch.randn(dg.n_local, 5, dtype=torch.float64)
    want = (d.unsqueeze(1) if row else 1.0) * (a_hat @ ((d.unsqueeze(1) if column else 1.0) * x))
    out = dg.aggregate(x.float(), "gcn", transposed, factors=GcnFactors(row=row, column=column)).double()
    assert torch.allclose(out, want, atol=1e-5)


def test_scaled_input_and_no_row_factor_match_dense():
    dg, indptr, indices = make_dg(seed=2)
    w = torch.from_numpy(aggregation_matrix(indptr, indices, "gcn").toarray())  # with its diagonal
    d = torch.from_numpy(_dinv64(indptr))
    x = torch.randn(dg.n_local, 6, dtype=torch.float64)
    f = dg.gcn_factor().double().unsqueeze(1)
    a_hat = w / d.unsqueeze(1) / d.unsqueeze(0)  # A + I
    assert torch.allclose(a_hat, torch.round(a_hat), atol=1e-9)
    # scaled input: the caller passes f * x, the result is W x
    out = dg.aggregate((f * x).float(), "gcn", factors=SCALED_INPUT).double()
    assert torch.allclose(out, w @ x, atol=1e-5)
    # no row factor, transposed: (A + I)^T diag(f) g
    g = torch.randn(dg.n_local, 6, dtype=torch.float64)
    out = dg.aggregate(g.float(), "gcn", transposed=True, factors=GcnFactors(row=False)).double()
    assert torch.allclose(out, a_hat.T @ (d.unsqueeze(1) * g), atol=1e-5)


@pytest.mark.parametrize("kind", ["sum", "mean", "sum_self"])
def test_scaled_input_needs_the_gcn_kind(kind):
    dg, _, _ = make_dg(seed=3)
    x = torch.randn(dg.n_local, 4)
    with pytest.raises(ValueError, match="gcn kind"):
        dg.aggregate(x, kind, factors=SCALED_INPUT)
    with pytest.raises(ValueError, match="gcn kind"):
        dg.aggregate(x, kind, transposed=True, factors=GcnFactors(row=False))
    assert torch.equal(dg.aggregate(x, kind, factors=WHOLE), dg.aggregate(x, kind))  # the plain call


def test_cpu_graph_takes_no_scaled_input_natively():
    dg, _, _ = make_dg(seed=4)
    assert not dg.takes_scaled_input("gcn") and not dg.takes_scaled_input("sum")


def test_aggregate_scaled_input_gradient_is_that_of_the_scaled_table():
    dg, indptr, indices = make_dg(n=25, e=90, seed=5)
    xs = torch.randn(dg.n_local, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: aggregate(t, dg, "gcn", factors=SCALED_INPUT), (xs,),
                                    eps=1e-6, atol=1e-5)
    # and it is W diag(1/f) of the scaled rows, in float64 against dense math
    w = torch.from_numpy(aggregation_matrix(indptr, indices, "gcn").toarray())
    d = torch.from_numpy(_dinv64(indptr))
    g = torch.randn(dg.n_local, 3, dtype=torch.float64)
    x32 = xs.detach().float().requires_grad_(True)
    aggregate(x32, dg, "gcn", factors=SCALED_INPUT).backward(g.float())
    assert torch.allclose(x32.grad.double(), (w / d.unsqueeze(0)).T @ g, atol=1e-5)


def test_global_dropout_row_scale_is_the_dropout_times_the_scale():
    dg, _, _ = make_dg(seed=6)
    x = torch.randn(dg.n_local, 5, requires_grad=True)
    s = torch.rand(dg.n_local) + 0.5
    plain = global_dropout(x, 0.4, dg, torch.Generator().manual_seed(7))
    scaled = global_dropout(x, 0.4, dg, torch.Generator().manual_seed(7), row_scale=s)
    assert torch.equal(scaled, plain * s.unsqueeze(1))
    assert torch.equal(global_dropout(x, 0.4, dg, None, training=False, row_scale=s), x * s.unsqueeze(1))
    g = torch.randn_like(x)
    scaled.backward(g)
    assert torch.allclose(x.grad, (plain != 0).float() / 0.6 * s.unsqueeze(1) * g, rtol=1e-6)
    with pytest.raises(ValueError, match="row_scale"):
        global_dropout(x, 0.4, dg, None, row_scale=s[:-1])


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_gcn_conv_on_a_scaled_input_equals_the_plain_conv(fin, fout):
    dg, _, _ = make_dg(seed=8)
    torch.manual_seed(0)
    conv = GCNConv(fin, fout)
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(dg.n_local, fin, requires_grad=True)
    ref = conv(x, dg)
    gref = torch.autograd.grad(ref.square().sum(), [x, conv.lin.weight])
    xs = x * dg.gcn_factor().unsqueeze(1)
    out = conv(xs, dg, input_scale=dg.gcn_factor())
    g = torch.autograd.grad(out.square().sum(), [x, conv.lin.weight])
    assert torch.allclose(out, ref, atol=1e-5)
    for a, b in zip(g, gref):
        assert torch.allclose(a, b, atol=1e-4)


def test_gcn_conv_refuses_an_input_scale_that_is_not_its_factor():
    dg, _, _ = make_dg(seed=9)
    conv = GCNConv(4, 3)
    x = torch.randn(dg.n_local, 4)
    with pytest.raises(ValueError, match="gcn_factor"):
        conv(x, dg, input_scale=dg.gcn_factor().clone())
    assert conv.input_scale(dg) is None  # the CPU graph takes no scaled table natively
