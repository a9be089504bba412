"""mgg/kernels/block_sum.cu on one GPU against dense float64 math: a block's scaled row sums with
the hash dropout folded in, and the transposed kernel (x's gradient). Widths on and off the
float4 path and past one 128-column chunk, isolated dst rows, repeated src ids, host and device
seeds, rows read from a table through an index; outputs land in NaN-poisoned memory."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.block_sum import block_sum_cuda, block_sum_grad_cuda  # noqa: E402
from mgg.nn.functional import hash_uniform, mix_seed  # noqa: E402
from mgg.testing.blocks import block_dense, random_block  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


def poison_allocator(numel: int) -> None:
    """Leave NaNs in the caching allocator's next block of this size (the kernels' outputs land there)."""
    t = torch.full((numel,), float("nan"), device=DEV)
    del t


def mask(n, width, seed, p):
    return hash_uniform(torch.arange(n), width, seed).numpy() >= p


@pytest.mark.parametrize("width", [1, 3, 4, 100, 128, 130, 256])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("seed", [None, 2 ** 45 + 11, "device"])
def test_sums_and_gradient_equal_dense_math(width, scaled, seed):
    n_dst, n_src, p = 300, 900, 0.3
    block = random_block(n_dst, n_src, max_deg=40, seed=width, device=DEV, isolated=5)
    x = torch.randn(n_src, width, device=DEV)
    gen = torch.Generator().manual_seed(width)
    src = (torch.rand(n_src, generator=gen) + 0.5).to(DEV) if scaled else None
    dst = (torch.rand(n_dst, generator=gen) + 0.5).to(DEV) if scaled else None
    if seed == "device":
        dev_seed = torch.tensor([987654321], dtype=torch.int64, device=DEV)
        host_seed = mix_seed(987654321)
    else:
        dev_seed = host_seed = seed
    a = block_dense(block)
    if scaled:
        a = a * src.cpu().double().numpy()[None, :] * dst.cpu().double().numpy()[:, None]
    x64 = x.cpu().double().numpy()
    if host_seed is not None:
        x64 = x64 * mask(n_src, width, host_seed, p) / (1 - p)
    poison_allocator(n_dst * width)
    out = block_sum_cuda(x, block.ptr, block.col, n_dst, src, dst, p if seed else 0.0, dev_seed)
    np.testing.assert_allclose(out.cpu().double().numpy(), a @ x64, rtol=1e-5, atol=1e-5)
    g = torch.randn(n_dst, width, device=DEV)
    gx = a.T @ g.cpu().double().numpy()
    if host_seed is not None:
        gx = gx * mask(n_src, width, host_seed, p) / (1 - p)
    got = block_sum_grad_cuda(g, block.ptr, block.col, n_src, src, dst, p if seed else 0.0, dev_seed)
    np.testing.assert_allclose(got.cpu().double().numpy(), gx, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [3, 100, 130])
@pytest.mark.parametrize("seed", [None, 2 ** 37 + 5])
def test_rows_read_through_an_index_equal_dense_math(width, seed):
    """x a table [N, F], src j's row x[src_index[j]]; the dropout numbers rows by j."""
    n_dst, n_src, n_table, p = 200, 600, 1500, 0.4
    block = random_block(n_dst, n_src, max_deg=30, seed=width + 1, device=DEV, isolated=3)
    table = torch.randn(n_table, width, device=DEV)
    index = torch.randint(0, n_table, (n_src,), device=DEV)
    src = (torch.rand(n_src) + 0.5).to(DEV)
    x64 = table.cpu().double().numpy()[index.cpu().numpy()]
    if seed is not None:
        x64 = x64 * mask(n_src, width, seed, p) / (1 - p)
    a = block_dense(block) * src.cpu().double().numpy()[None, :]
    poison_allocator(n_dst * width)
    out = block_sum_cuda(table, block.ptr, block.col, n_dst, src, None, p if seed else 0.0, seed, src_index=index)
    np.testing.assert_allclose(out.cpu().double().numpy(), a @ x64, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="src_index must be a 1-D int64"):
        block_sum_cuda(table, block.ptr, block.col, n_dst, src_index=index.int())
    # the table given by its address in device memory: the same sums
    addr = torch.tensor([table.data_ptr()], dtype=torch.int64, device=DEV)
    template = torch.empty((0, width), device=DEV)
    poison_allocator(n_dst * width)
    by_addr = block_sum_cuda(template, block.ptr, block.col, n_dst, src, None, p if seed else 0.0, seed,
                             src_index=index, x_addr=addr)
    assert torch.equal(by_addr, out)
    with pytest.raises(ValueError, match="give both"):
        block_sum_cuda(template, block.ptr, block.col, n_dst, x_addr=addr)


def test_unaligned_rows_take_the_scalar_path():
    block = random_block(50, 120, 8, seed=3, device=DEV)
    base = torch.randn(120 * 8 + 1, device=DEV)
    x = base[1:].view(120, 8)  # 4-byte but not 16-byte aligned
    out = block_sum_cuda(x, block.ptr, block.col, 50)
    np.testing.assert_allclose(out.cpu().double().numpy(), block_dense(block) @ x.cpu().double().numpy(),
                               rtol=1e-5, atol=1e-5)


def test_an_empty_block_gives_zero_rows():
    block = random_block(7, 10, 0, seed=1, device=DEV)
    poison_allocator(7 * 16)
    out = block_sum_cuda(torch.randn(10, 16, device=DEV), block.ptr, block.col, 7)
    assert torch.equal(out, torch.zeros(7, 16, device=DEV))
    grad = block_sum_grad_cuda(torch.randn(7, 16, device=DEV), block.ptr, block.col, 10)
    assert torch.equal(grad, torch.zeros(10, 16, device=DEV))


def test_bad_arguments_are_refused():
    block = random_block(5, 9, 3, seed=2, device=DEV)
    x = torch.randn(9, 4, device=DEV)
    with pytest.raises(ValueError, match="dst_scale must have shape"):
        block_sum_cuda(x, block.ptr, block.col, 5, dst_scale=torch.ones(4, device=DEV))
    with pytest.raises(ValueError, match="p must be in"):
        block_sum_cuda(x, block.ptr, block.col, 5, p=1.0, seed=3)
    with pytest.raises(TypeError, match="int64 tensors"):
        block_sum_cuda(x, block.ptr.int(), block.col, 5)
