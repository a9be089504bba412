"""mgg.nn.dense.project on a tall CUDA matrix (the custom backward) against float64."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mgg.nn.dense import TALL_ROWS, project  # noqa: E402


def test_tall_projection_gradients_match_float64():
    torch.manual_seed(0)
    n = TALL_ROWS + 12345
    x = torch.randn(n, 24, device="cuda", requires_grad=True)
    w = torch.randn(5, 24, device="cuda", requires_grad=True)
    g = torch.randn(n, 5, device="cuda")
    out = project(x, w)
    out.backward(g)
    x64, w64, g64 = x.detach().double(), w.detach().double(), g.double()
    torch.testing.assert_close(out.double(), x64 @ w64.t(), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(w.grad.double(), g64.t() @ x64, rtol=1e-4, atol=1e-1)
    torch.testing.assert_close(x.grad.double(), g64 @ w64, rtol=1e-4, atol=1e-3)
