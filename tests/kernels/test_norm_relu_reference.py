"""The math of the fused batch-norm + ReLU kernels (mgg.kernels.norm_relu.bn_relu_reference, the
GPU tests' oracle) against autograd of F.batch_norm then ReLU in float64, on the CPU: forward,
the masked sums and dx, for one process and for rows split over "ranks" whose sums add up."""
import pytest
import torch
import torch.nn.functional as F

from mgg.kernels.norm_relu import bn_relu_reference, supports


@pytest.mark.parametrize("affine", [True, False])
def test_reference_is_batch_norm_then_relu(affine):
    gen = torch.Generator().manual_seed(1)
    n, d = 257, 8
    x = (torch.randn(n, d, generator=gen, dtype=torch.float64) * 3 + 2).requires_grad_()
    w = (torch.rand(d, generator=gen, dtype=torch.float64) + 0.5).requires_grad_() if affine else None
    b = torch.randn(d, generator=gen, dtype=torch.float64).requires_grad_() if affine else None
    dy = torch.randn(n, d, generator=gen, dtype=torch.float64)
    eps = 1e-5
    y = torch.relu(F.batch_norm(x, None, None, w, b, True, 0.0, eps))
    (y * dy).sum().backward()
    mean = x.detach().mean(0)
    invstd = torch.rsqrt(x.detach().var(0, unbiased=False) + eps)
    args = (x.detach(), mean, invstd, None if w is None else w.detach(), None if b is None else b.detach())
    assert torch.allclose(bn_relu_reference(*args), y.detach(), atol=1e-12)
    s_dy, s_xmu, dx = bn_relu_reference(*args, dy=dy)
    assert torch.allclose(dx, x.grad, atol=1e-12)
    if affine:  # grad b = sum of the masked dy, grad w = sum dy' (x - mean) invstd
        assert torch.allclose(s_dy, b.grad, atol=1e-12)
        assert torch.allclose(s_xmu * invstd, w.grad, atol=1e-12)
    # two "ranks": each one's dx from the summed sums and the total count is the whole dx
    lo, hi = args[0][:100], args[0][100:]
    parts = [bn_relu_reference(part, *args[1:], dy=g) for part, g in ((lo, dy[:100]), (hi, dy[100:]))]
    sums = (parts[0][0] + parts[1][0], parts[0][1] + parts[1][1])
    dx2 = torch.cat([bn_relu_reference(part, *args[1:], dy=g, count=n, sums=sums)[2]
                     for part, g in ((lo, dy[:100]), (hi, dy[100:]))])
    assert torch.allclose(dx2, x.grad, atol=1e-12)


def test_supports_only_cuda_float32_power_of_two_widths():
    assert not supports(torch.zeros(4, 64))  # CPU rows: the two-step path


def test_dist_batch_norm_relu_on_the_cpu_is_the_two_steps():
    """DistBatchNorm(x, relu=True) off the GPU: batch norm, then ReLU (training and eval)."""
    from mgg.nn.norm import DistBatchNorm

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(50, 8, generator=gen) * 2 + 1
    bn = DistBatchNorm(8)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=gen)
        bn.bias.normal_(generator=gen)
    for training in (True, False):
        bn.train(training)
        a = DistBatchNorm(8)
        a.load_state_dict(bn.state_dict())
        a.train(training)
        assert torch.equal(bn(x, relu=True), torch.relu(a(x)))


def test_gin_hands_the_relu_after_a_norm_to_the_norm():
    """GINConv's MLP runner: a stage with takes_relu followed by nn.ReLU gets relu=True and the
    ReLU stage is skipped; other stages run as before (needs_graph ones with the graph)."""
    from torch import nn

    from mgg.nn.conv.gin_conv import _run

    calls = []

    class Norm(nn.Module):
        needs_graph = True
        takes_relu = True

        def forward(self, h, dg, relu=False):
            calls.append(("norm", dg, relu))
            return h + 1

    class GraphStage(nn.Module):
        needs_graph = True

        def forward(self, h, dg):
            calls.append(("graph", dg))
            return h * 2

    h = torch.zeros(3, 2)
    out = _run([nn.Identity(), Norm(), nn.ReLU(), GraphStage(), nn.ReLU(), Norm()], h, "G")
    assert calls == [("norm", "G", True), ("graph", "G"), ("norm", "G", False)]
    assert torch.equal(out, torch.full((3, 2), 3.0))
