"""linear_relu on the GPU (relu(x W^T + b) with the ReLU in cuBLASLt's epilogue,
torch._addmm_activation; its backward's mask and bias gradient in one kernel,
mgg/kernels/relu_grad.cu) against float64, and GIN with its ReLUs in GEMM epilogues against the
same model with every ReLU a step of its own. Needs CUDA and cupy."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mgg.nn import GIN, GINConv  # noqa: E402
from mgg.nn.dense import linear_relu  # noqa: E402
from mgg.testing.dense_gin import dense_gin_input  # noqa: E402

pytest.importorskip("cupy")


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("n,d", [(0, 64), (1, 4), (1000, 8), (100_003, 64), (3000, 1024)])
def test_relu_backward_colsum_is_the_mask_and_its_column_sums(n, d):
    from mgg.kernels.relu_grad import relu_backward_colsum

    gen = torch.Generator().manual_seed(n + d)
    y = torch.relu(torch.randn(n, d, generator=gen))
    y[::7] = 0.0  # exact zeros: masked, as threshold_backward masks them
    g = torch.randn(n, d, generator=gen)
    gout, db = relu_backward_colsum(g.cuda(), y.cuda())
    want = torch.where(y > 0, g, torch.zeros_like(g))
    assert torch.equal(gout.cpu(), want)  # a select, bit for bit
    ref = want.double().sum(0)
    assert db.shape == (d,) and torch.allclose(db.cpu().double(), ref, rtol=1e-5, atol=1e-4)


def test_relu_backward_colsum_refuses_what_it_cannot_take():
    from mgg.kernels.relu_grad import relu_backward_colsum

    with pytest.raises(ValueError, match="D = 4"):
        relu_backward_colsum(torch.zeros(5, 12, device="cuda"), torch.zeros(5, 12, device="cuda"))
    with pytest.raises(ValueError, match="one shape"):
        relu_backward_colsum(torch.zeros(5, 8, device="cuda"), torch.zeros(6, 8, device="cuda"))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_relu_cuda_matches_float64(bias, monkeypatch):
    import mgg.kernels.relu_grad as relu_grad

    used = []
    real = relu_grad.relu_backward_colsum
    monkeypatch.setattr(relu_grad, "relu_backward_colsum", lambda *a: used.append(1) or real(*a))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(50_000, 64, generator=gen)
    w = torch.randn(64, 64, generator=gen) / 8
    b = torch.randn(64, generator=gen) if bias else None
    g = torch.randn(50_000, 64, generator=gen)
    xc, wc = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    bc = b.cuda().requires_grad_() if bias else None
    out = linear_relu(xc, wc, bc)
    out.backward(g.cuda())
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    br = b.double().requires_grad_() if bias else None
    pre = xr @ wr.T + (br if bias else 0)
    ref = torch.relu(pre)
    ref.backward(g.double())
    o = out.detach().cpu()
    assert rel(o, ref.detach()) < 1e-6
    assert (o[pre.detach() < -1e-3] == 0).all() and (o[pre.detach() > 1e-3] > 0).all()
    assert rel(xc.grad.cpu(), xr.grad) < 1e-5 and rel(wc.grad.cpu(), wr.grad) < 1e-5
    if bias:
        assert rel(bc.grad.cpu(), br.grad) < 1e-5
    assert len(used) == (1 if bias else 0)  # the one-pass kernel where there is a bias gradient


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_gin_relus_in_epilogues_match_separate_steps(monkeypatch, norm):
    """GIN forward and backward with the ReLUs in GEMM epilogues equal the same model with
    fuse_relu off (every ReLU its own step), in float32 rounding; the epilogue path is taken."""
    x, graph = dense_gin_input(monkeypatch)
    calls = []
    real = torch._addmm_activation
    monkeypatch.setattr(torch, "_addmm_activation", lambda *a, **k: calls.append(1) or real(*a, **k))
    outs = []
    for fuse in (True, False):
        torch.manual_seed(0)
        model = GIN(12, 32, 5, layers=3, dropout=0.0, norm=norm).cuda()
        model.cache_input_aggregation = False
        for mod in model.modules():
            if isinstance(mod, GINConv):
                mod.fuse_relu = fuse
        before = len(calls)
        out = model(x, graph)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in model.parameters()], len(calls) - before))
    # 3 layers: the activation after layers 1 and 2 (their last Linear), plus the inner Linear ->
    # ReLU of layers 1 and 2 without a norm -- layer 3's inner Linear narrows 32 -> 5 columns, so it
    # projects before its aggregation and its bias and ReLU run after it; with batch norm every
    # ReLU follows a norm and runs in it
    assert outs[0][2] == (4 if norm == "none" else 0) and outs[1][2] == 0
    assert torch.allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
    for a, b in zip(outs[0][1], outs[1][1]):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-3)
