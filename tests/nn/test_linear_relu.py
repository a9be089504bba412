"""relu(x W^T + b) with the ReLU in the GEMM's epilogue (mgg.nn.dense.linear_relu), and GIN
running its ReLUs that way (GINConv(relu_out=True), the model passing its activation in)."""
import pytest
import torch

from mgg.nn import GINConv, build_model
from mgg.nn.dense import linear_relu
from mgg.testing.dist_graphs import single_rank_graph
from mgg.testing.reference import dense_aggregation_matrix
from mgg.testing.tensors import leaf


@pytest.mark.parametrize("bias", [True, False])
def test_linear_relu_matches_float64_autograd(bias):
    torch.manual_seed(3)
    x = torch.randn(300, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True) if bias else None
    with torch.no_grad():
        x[:4] = 0.0  # pre-activations exactly at 0 when there is no bias: gradient 0 there, as relu's
    g = torch.randn(300, 5, dtype=torch.float64)
    out = linear_relu(x, w, b)
    out.backward(g)
    xr, wr = leaf(x), leaf(w)
    br = leaf(b) if bias else None
    ref = torch.relu(xr @ wr.T + (br if bias else 0))
    ref.backward(g)
    assert torch.allclose(out, ref, atol=1e-12) and (out >= 0).all()
    assert torch.allclose(x.grad, xr.grad, atol=1e-12) and torch.allclose(w.grad, wr.grad, atol=1e-12)
    if bias:
        assert torch.allclose(b.grad, br.grad, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: linear_relu(*t), (x[4:40].detach().requires_grad_(), w, b))


def test_linear_relu_float32_equals_linear_then_relu_and_rejects_3d():
    x, w, b = torch.randn(64, 16), torch.randn(8, 16), torch.randn(8)
    assert torch.equal(linear_relu(x, w, b), torch.relu(torch.nn.functional.linear(x, w, b)))
    with torch.no_grad():
        assert torch.equal(linear_relu(x, w, None), torch.relu(x @ w.T))
    with pytest.raises(ValueError, match="2-D"):
        linear_relu(x.reshape(4, 16, 16), w, b)


@pytest.mark.parametrize("mlp_end", ["linear", "tanh"])
def test_gin_conv_relu_out_matches_dense_float64_with_grads(mlp_end):
    """relu_out = relu of the conv's output: in the last Linear's epilogue, or after a last stage
    that is not a Linear."""
    torch.manual_seed(5)
    dg, indptr, indices = single_rank_graph(seed=11)
    stages = [torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)]
    if mlp_end == "tanh":
        stages.append(torch.nn.Tanh())
    mlp = torch.nn.Sequential(*stages).double()
    conv = GINConv(mlp, eps=0.0).double()
    x = torch.randn(dg.n_local, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(dg.n_local, 3, dtype=torch.float64)
    out = conv(x, dg, relu_out=True)
    out.backward(g)
    a = dense_aggregation_matrix(indptr, indices, "sum")
    xr, w1, b1, w2, b2 = (leaf(t) for t in (x, mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias))
    h = torch.relu((xr + a @ xr) @ w1.T + b1) @ w2.T + b2
    ref = torch.relu(torch.tanh(h) if mlp_end == "tanh" else h)
    ref.backward(g)
    assert torch.allclose(out, ref, atol=1e-10)
    for got, want in ((x.grad, xr.grad), (mlp[0].weight.grad, w1.grad), (mlp[2].weight.grad, w2.grad),
                      (mlp[2].bias.grad, b2.grad)):
        assert torch.allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("norm", ["none", "batch", "layer"])
def test_gin_model_fused_relus_equal_unfused(norm):
    """The whole GIN (its MLP ReLUs and the activation between layers in GEMM epilogues) gives
    the logits and gradients of the same model with every ReLU a step of its own."""
    dg, _, _ = single_rank_graph(n=60, e=300, seed=12)
    x = torch.randn(dg.n_local, 5)
    results = []
    for fuse in (True, False):
        torch.manual_seed(0)
        model = build_model("gin", 5, 8, 3, layers=3, dropout=0.0, norm=norm)
        for m in model.modules():
            if isinstance(m, GINConv):
                m.fuse_relu = fuse
        out = model(x, dg)
        out.square().sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (o1, g1), (o2, g2) = results
    assert torch.allclose(o1, o2, rtol=1e-6, atol=1e-6)
    for name in g1:
        assert torch.allclose(g1[name], g2[name], rtol=1e-5, atol=1e-6), name
