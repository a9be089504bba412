"""mgg.nn.dense: the projection's custom backward against autograd (CPU; CUDA in tests/nn/test_dense_gpu.py)."""
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


def test_linear_function_gradients_match_autograd_in_float64():
    """_Linear (the tall-GEMM path's autograd; on CPU its GEMMs are torch's) against F.linear."""
    from mgg.nn.dense import _Linear

    torch.manual_seed(2)
    x = torch.randn(257, 13, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 13, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out = _Linear.apply(x, w, b)
    out.sin().sum().backward()
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    ref = torch.nn.functional.linear(x, w, b)
    ref.sin().sum().backward()
    torch.testing.assert_close(out, ref.detach())
    for a, t in zip(got, (x, w, b)):
        torch.testing.assert_close(a, t.grad)


def test_linear_on_cpu_is_f_linear_and_tall_gemm_needs_cuda():
    from mgg.nn.dense import TALL_GEMM_ROWS, linear, tall_gemm

    x = torch.randn(TALL_GEMM_ROWS, 8)
    w, b = torch.randn(4, 8), torch.randn(4)
    assert not tall_gemm(x, 8, 4)  # a CPU matrix never takes the CUDA kernel
    assert torch.equal(linear(x[:100], w, b), torch.nn.functional.linear(x[:100], w, b))


def test_tall_gemm_kernel_limits_are_stated():
    """Widths the tall-GEMM kernel takes (mgg/kernels/tall_gemm.cu: 4 register chunks of 16 inner
    columns a pass, two passes, 8 n8 accumulator tiles, float4 rows in and float2 pairs out; the
    prologue in one pass; the weight gradient both widths up to 64), checked without a GPU."""
    from mgg.kernels.tall_gemm import MAX_K, MAX_N, supports

    assert supports(64, 64) and supports(4, 2) and supports(12, 20) and supports(60, 48)
    assert supports(100, 64) and supports(128, 64) and supports(68, 2)
    assert not supports(0, 64) and not supports(MAX_K + 4, 16) and not supports(102, 64)
    assert not supports(62, 64) and not supports(64, 47) and not supports(64, MAX_N + 2)
    assert supports(64, 64, prologue=True) and not supports(68, 64, prologue=True)
    from mgg.kernels.tall_gemm import supports_weight_grad

    assert supports_weight_grad(64, 64) and supports_weight_grad(4, 48) and not supports_weight_grad(64, 62)
    assert not supports_weight_grad(100, 64) and not supports_weight_grad(64, 47)
