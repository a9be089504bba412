"""mgg.nn.block_sum's kernel path (float32 CUDA) against its torch-op path on the CPU: the same
dropout mask, sums and gradient; a sampled SAGE step on the GPU equals the CPU's, also with its
input as IndexedRows of a table."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.nn import IndexedRows, SampledGCN, SampledSAGE  # noqa: E402
from mgg.nn.block_sum import BlockDropout, block_sum  # noqa: E402
from mgg.testing.blocks import random_block  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("width", [7, 100])
def test_kernel_path_equals_the_torch_path(width):
    block = random_block(200, 500, 25, seed=width)
    x = torch.randn(500, width, requires_grad=True)
    xg = x.detach().to(DEV).requires_grad_(True)
    dst = torch.rand(200) + 0.5
    drop = BlockDropout(0.5, 2 ** 33 + 5)
    out_cpu = block_sum(x, block, dst_scale=dst, drop=drop)
    out_gpu = block_sum(xg, block.to(DEV), dst_scale=dst.to(DEV), drop=drop)
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-5, atol=1e-5)
    g = torch.randn(200, width)
    out_cpu.backward(g)
    out_gpu.backward(g.to(DEV))
    torch.testing.assert_close(xg.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)


def test_a_sampled_sage_step_on_the_gpu_equals_the_cpu():
    torch.manual_seed(0)
    model = SampledSAGE(16, 32, 5, layers=2, dropout=0.5)
    blocks = [random_block(60, 300, 10, seed=1), random_block(8, 60, 6, seed=2)]
    x = torch.randn(300, 16)
    out_cpu = model(x, blocks, torch.Generator().manual_seed(3))
    out_cpu.sum().backward()
    grads_cpu = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.to(DEV)
    out_gpu = model(x.to(DEV), [b.to(DEV) for b in blocks], torch.Generator().manual_seed(3))
    out_gpu.sum().backward()
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-4, atol=1e-5)
    for gc, p in zip(grads_cpu, model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), gc, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [SampledSAGE, SampledGCN])
def test_a_sampled_step_on_indexed_rows_on_the_gpu_equals_the_cpu(cls):
    torch.manual_seed(0)
    model = cls(16, 32, 5, layers=2, dropout=0.5)
    blocks = [random_block(60, 300, 10, seed=1), random_block(8, 60, 6, seed=2)]
    table = torch.randn(1000, 16)
    index = torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(5))
    out_cpu = model(table[index], blocks, torch.Generator().manual_seed(3))
    out_cpu.sum().backward()
    grads_cpu = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.to(DEV)
    rows = IndexedRows(table.to(DEV), index.to(DEV))
    out_gpu = model(rows, [b.to(DEV) for b in blocks], torch.Generator().manual_seed(3))
    out_gpu.sum().backward()
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-4, atol=1e-5)
    for gc, p in zip(grads_cpu, model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), gc, rtol=1e-4, atol=1e-4)


def test_indexed_rows_by_address_read_the_rows_at_that_address():
    table = torch.randn(500, 12, device=DEV)
    index = torch.randint(0, 500, (300,), device=DEV)
    addr = torch.tensor([table.data_ptr()], dtype=torch.int64, device=DEV)
    rows = IndexedRows(torch.empty((0, 12), device=DEV), index, addr)
    assert torch.equal(rows.materialize(), table[index]) and torch.equal(rows.head(40).materialize(), table[index[:40]])
    block = random_block(60, 300, 10, seed=4).to(DEV)
    torch.testing.assert_close(block_sum(rows, block), block_sum(table[index], block), rtol=1e-6, atol=1e-6)
    other = torch.randn(500, 12, device=DEV)
    addr.fill_(other.data_ptr())  # the next batch: only the address changes
    assert torch.equal(rows.materialize(), other[index])
