"""mgg.nn.dense: the projection's custom backward against autograd (CPU; CUDA in tests/gpu)."""
import torch

from mgg.nn.dense import _Project


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
