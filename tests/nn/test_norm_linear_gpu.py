"""mgg.nn.norm_linear: batch norm + ReLU applied inside the next Linear's GEMM (the tall-GEMM
kernels' prologue) against float64 batch norm, ReLU and Linear: output, the gradients of x, the
norm's affine weights and the Linear's weight and bias, the running statistics; then GIN with it
against GIN running the stages one by one. One rank; needs CUDA and cupy."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.nn import dense  # noqa: E402
from mgg.nn import norm_linear  # noqa: E402
from mgg.nn.norm import DistBatchNorm  # noqa: E402


def rel(a, b):
    return float((a.double().cpu() - b).norm() / max(float(b.norm()), 1e-30))


def gapped_problem(n: int, d: int, o: int, seed: int):
    """x float32 [n, d] in two clusters per column, |x - mean| >= 0.7 std, the norm's weight and
    bias [d] (the offset keeps the ReLU's threshold inside the gap, so no entry lies within
    rounding of it), a Linear's weight [o, d] and bias [o], and an output gradient [n, o]."""
    gen = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (n, d), generator=gen).float() * 2 - 1
    x = sign * (1.0 + 0.5 * torch.rand(n, d, generator=gen)) * (torch.rand(d, generator=gen) + 0.5) \
        + torch.randn(d, generator=gen)
    w = torch.rand(d, generator=gen) + 0.5
    b = torch.randn(d, generator=gen).clamp(-2, 2) * 0.1
    lw = torch.randn(o, d, generator=gen) / d ** 0.5
    lb = torch.randn(o, generator=gen) * 0.1
    return x, w, b, lw, lb, torch.randn(n, o, generator=gen)


@pytest.mark.parametrize("n,d,o", [(100_003, 64, 64), (70_001, 64, 48), (65_536, 16, 20)])
@pytest.mark.parametrize("relu_out,lin_bias", [(True, True), (False, True), (True, False)])
def test_norm_relu_linear_matches_float64(n, d, o, relu_out, lin_bias):
    """The rows are two clusters per column, |x - mean| >= 0.7 std, and the norm's offset keeps
    the ReLU's threshold inside the gap: no entry lies within rounding of it (one entry whose
    mask flipped between float64 and float32 would move dx by 1e-3 relative)."""
    x, w, b, lw, lb, gy = gapped_problem(n, d, o, seed=n + d + o)

    bn = DistBatchNorm(d).cuda().train()
    lin = nn.Linear(d, o, bias=lin_bias).cuda()
    with torch.no_grad():
        bn.weight.copy_(w)
        bn.bias.copy_(b)
        lin.weight.copy_(lw)
        if lin_bias:
            lin.bias.copy_(lb)
    xc = x.cuda().requires_grad_()
    assert norm_linear.fuses(bn, xc, None, lin)
    y = norm_linear.norm_relu_linear(bn, xc, None, lin, relu_out)
    y.backward(gy.cuda())

    xr, wr, br, lwr = (t.double().requires_grad_() for t in (x, w, b, lw))
    lbr = lb.double().requires_grad_() if lin_bias else None
    ref = F.linear(torch.relu(F.batch_norm(xr, None, None, wr, br, True, 0.0, bn.eps)), lwr, lbr)
    if relu_out:  # the output ReLU's mask as the kernel's output has it (rounding near 0)
        ref.backward(torch.where(y.detach().cpu() > 0, gy.double(), torch.zeros((), dtype=torch.float64)))
        ref = torch.relu(ref)
    else:
        ref.backward(gy.double())
    assert rel(y.detach(), ref.detach()) < 1e-5
    assert rel(xc.grad, xr.grad) < 1e-4
    assert rel(bn.weight.grad, wr.grad) < 1e-4 and rel(bn.bias.grad, br.grad) < 1e-4
    assert rel(lin.weight.grad, lwr.grad) < 1e-5
    if lin_bias:
        assert rel(lin.bias.grad, lbr.grad) < 1e-5
    # running statistics: momentum 0.1 from (0, 1), the unbiased variance
    xd = x.double()
    assert torch.allclose(bn.running_mean.cpu().double(), 0.1 * xd.mean(0), rtol=1e-5, atol=1e-6)
    assert torch.allclose(bn.running_var.cpu().double(), 0.9 + 0.1 * xd.var(0), rtol=1e-5, atol=1e-6)


def test_fuses_only_where_every_piece_runs_on_the_gpu(monkeypatch):
    bn = DistBatchNorm(64).cuda().train()
    lin = nn.Linear(64, 64).cuda()
    x = torch.zeros(dense.TALL_GEMM_ROWS, 64, device="cuda")
    assert norm_linear.fuses(bn, x, None, lin)
    assert not norm_linear.fuses(bn, x[:100], None, lin)  # short: cuBLAS and the norm's own kernel
    assert not norm_linear.fuses(bn, x.cpu(), None, lin.cpu())
    assert not norm_linear.fuses(bn, x, None, nn.Linear(64, 100).cuda())  # wider than the kernel's 64
    bn.eval()
    assert not norm_linear.fuses(bn, x, None, lin)  # running statistics: the stages
    bn.train()
    bn.fuse_relu = False
    assert not norm_linear.fuses(bn, x, None, lin)
    bn.fuse_relu = True
    monkeypatch.setenv("MGG_TALL_GEMM", "0")
    assert not norm_linear.fuses(bn, x, None, lin)


@pytest.mark.parametrize("layers", [2, 3])
def test_gin_with_the_fused_norm_matches_the_stages(layers, monkeypatch):
    """A GIN step (batch norm, tall rows) with the norm inside the next GEMM equals the model
    running norm, ReLU and Linear as separate stages, and it runs the fused path where the
    widths allow (the last layer's stages one by one: the two paths mix in one model)."""
    from mgg.nn import GIN
    from mgg.testing.dense_gin import dense_gin_input

    monkeypatch.setattr(dense, "TALL_GEMM_ROWS", 64)  # the small test graph counts as tall
    calls = []
    real = norm_linear._NormReluLinear.apply
    monkeypatch.setattr(norm_linear._NormReluLinear, "apply", lambda *a: calls.append(1) or real(*a))
    x, graph = dense_gin_input(monkeypatch)
    outs = []
    for fused in (True, False):
        torch.manual_seed(0)
        model = GIN(int(x.shape[1]), 32, 5, layers=layers, dropout=0.0, norm="batch").cuda()
        model.cache_input_aggregation = False
        for conv in model.convs:
            conv.fuse_norm_linear = fused
        out = model(x, graph)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in model.parameters()],
                     [m.running_var.clone() for m in model.modules() if isinstance(m, DistBatchNorm)]))
        # every layer but the last, whose Linear has an odd width (5 classes) the kernel does not take
        assert len(calls) == (layers - 1 if fused else 0)
        calls.clear()
    assert rel(outs[0][0], outs[1][0].double().cpu()) < 1e-4
    for a, b in zip(outs[0][1], outs[1][1]):
        assert rel(a, b.double().cpu()) < 1e-3
    for a, b in zip(outs[0][2], outs[1][2]):
        assert rel(a, b.double().cpu()) < 1e-6


@pytest.mark.parametrize("relu_out", [False, True])
def test_norm_relu_linear_across_ranks(relu_out, monkeypatch):
    """Under mpirun with P ranks (one GPU each; also P = 1): each rank holds a contiguous share of
    the rows, the norm's statistics are summed over ranks (the store), and the fused op equals
    float64 batch norm, ReLU and Linear over all rows: this rank's output rows and x's gradient;
    the sums over ranks of the affine and Linear gradients; the running statistics."""
    import numpy as np

    from mgg.runtime import world
    from mgg.testing.batch_norm import host_sum, norm_graph

    comm = world()
    store = None
    if comm.size > 1:
        pytest.importorskip("nvshmem.core")
        from mgg.graph import make_store

        store = make_store(comm, "gpu")
    monkeypatch.setattr(dense, "TALL_GEMM_ROWS", 64)  # every rank's share counts as tall
    n, d, o = 20_011, 32, 24
    x, w, b, lw, lb, gy = gapped_problem(n, d, o, seed=5)
    bounds = [int(v) for v in np.linspace(0, n, comm.size + 1)]
    lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
    dg = norm_graph(comm, store, bounds)

    bn = DistBatchNorm(d).cuda().train()
    lin = nn.Linear(d, o).cuda()
    with torch.no_grad():
        bn.weight.copy_(w)
        bn.bias.copy_(b)
        lin.weight.copy_(lw)
        lin.bias.copy_(lb)
    xc = x[lo:hi].cuda().requires_grad_()
    assert norm_linear.fuses(bn, xc, dg, lin)
    y = norm_linear.norm_relu_linear(bn, xc, dg, lin, relu_out)
    xr, wr, br, lwr, lbr = (t.double().requires_grad_() for t in (x, w, b, lw, lb))
    ref = F.linear(torch.relu(F.batch_norm(xr, None, None, wr, br, True, 0.0, bn.eps)), lwr, lbr)
    g = gy.double()
    if relu_out:  # the output ReLU's mask as every rank's kernel output has it (rounding near 0)
        mine = np.zeros((n, o))
        mine[lo:hi] = (y.detach().cpu() > 0).numpy()
        mask = torch.from_numpy(host_sum(comm, mine) > 0.5)
        g = torch.where(mask, g, torch.zeros((), dtype=torch.float64))
        ref = torch.relu(ref)
    y.backward(gy[lo:hi].cuda())
    ref.backward(g)
    assert rel(y.detach(), ref.detach()[lo:hi]) < 1e-5
    assert rel(xc.grad, xr.grad[lo:hi]) < 1e-4
    for mine, want, tol in ((bn.weight.grad, wr.grad, 1e-4), (bn.bias.grad, br.grad, 1e-4),
                            (lin.weight.grad, lwr.grad, 1e-5), (lin.bias.grad, lbr.grad, 1e-5)):
        total = torch.from_numpy(host_sum(comm, mine.detach().cpu().numpy()))
        assert rel(total, want) < tol
    xd = x.double()
    assert np.allclose(bn.running_mean.cpu().double(), 0.1 * xd.mean(0), rtol=1e-5, atol=1e-6)
    assert np.allclose(bn.running_var.cpu().double(), 0.9 + 0.1 * xd.var(0), rtol=1e-5, atol=1e-6)
