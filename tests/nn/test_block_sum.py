"""mgg.nn.block_sum (the torch-op path: CPU, and any non-float32 tensor) against dense float64
math: scaled sums over a block's sampled edges with the input dropout folded in, and their
gradient; the sampled block convolutions with a BlockDropout against dropping x first."""
import numpy as np
import pytest
import torch

from mgg.nn import SAGEBlockConv, GCNBlockConv
from mgg.nn.block_sum import BlockDropout, block_sum
from mgg.nn.functional import hash_uniform
from mgg.testing.blocks import block_dense, random_block


def dense_reference(x, block, src_scale, dst_scale, drop):
    """float64 [n_dst, F]: diag(dst) A diag(src) (x * mask / (1 - p))."""
    x64 = x.detach().to(torch.float64).numpy()
    if drop is not None:
        keep = hash_uniform(torch.arange(x.shape[0]), x.shape[1], drop.seed).numpy() >= drop.p
        x64 = x64 * keep / (1.0 - drop.p)
    a = block_dense(block)
    if src_scale is not None:
        a = a * src_scale.to(torch.float64).numpy()[None, :]
    if dst_scale is not None:
        a = a * dst_scale.to(torch.float64).numpy()[:, None]
    return a @ x64, a


@pytest.mark.parametrize("width", [1, 5, 64])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_block_sum_and_its_gradient_equal_dense_math(width, scaled, p):
    block = random_block(n_dst=30, n_src=70, max_deg=9, seed=width)
    x = torch.randn(70, width, dtype=torch.float32).requires_grad_(True)
    g = torch.Generator().manual_seed(4)
    src = torch.rand(70, generator=g) + 0.5 if scaled else None
    dst = torch.rand(30, generator=g) + 0.5 if scaled else None
    drop = BlockDropout(p, 2 ** 40 + 7) if p else None
    out = block_sum(x, block, src, dst, drop)
    want, a = dense_reference(x, block, src, dst, drop)
    assert out.shape == (30, width)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn(30, width)
    out.backward(grad_out)
    gx = a.T @ grad_out.double().numpy()
    if drop is not None:
        gx = gx * (hash_uniform(torch.arange(70), width, drop.seed).numpy() >= p) / (1 - p)
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-5, atol=1e-5)


def test_block_sum_refuses_rows_that_are_not_the_blocks_src_nodes():
    block = random_block(4, 9, 3, seed=1)
    with pytest.raises(ValueError, match="x has 8 rows, the block has 9 src nodes"):
        block_sum(torch.zeros(8, 2), block)


@pytest.mark.parametrize("conv_cls,fin,fout", [(SAGEBlockConv, 6, 10), (SAGEBlockConv, 10, 6), (SAGEBlockConv, 8, 8),
                                               (GCNBlockConv, 6, 10), (GCNBlockConv, 10, 6), (GCNBlockConv, 8, 8)])
def test_block_convs_fold_the_dropout_as_dropping_x_first_would(conv_cls, fin, fout):
    torch.manual_seed(0)
    conv = conv_cls(fin, fout).double()
    block = random_block(12, 40, 6, seed=fin * fout)
    x = torch.randn(40, fin, dtype=torch.float64)
    drop = BlockDropout(0.4, 12345)
    fused = conv(x, block, drop=drop)
    first = conv(drop.apply(x), block)
    torch.testing.assert_close(fused, first, rtol=1e-12, atol=1e-12)
    assert not torch.equal(fused, conv(x, block))  # the dropout did drop
