"""mgg.nn.dense: the blocked weight gradient against float64 (CPU; the CUDA path in tests/gpu)."""
import torch

from mgg.nn.dense import _Project, blocked_weight_grad


def test_blocked_weight_grad_matches_float64():
    torch.manual_seed(0)
    for n in (5, 64, 1000, 1027):  # fewer rows than two blocks, exact blocks, a remainder
        g, x = torch.randn(n, 3), torch.randn(n, 7)
        got = blocked_weight_grad(g, x, block=16)
        torch.testing.assert_close(got.double(), g.double().t() @ x.double(), rtol=1e-5, atol=1e-4)


def test_project_function_gradients_match_autograd():
    torch.manual_seed(1)
    x = torch.randn(300, 9, requires_grad=True)
    w = torch.randn(4, 9, requires_grad=True)
    out = _Project.apply(x, w)
    (out.sin().sum()).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ((x @ w.t()).sin().sum()).backward()
    torch.testing.assert_close(out, (x @ w.t()).detach())
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)
