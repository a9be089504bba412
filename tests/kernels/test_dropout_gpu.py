"""Fused hash dropout (mgg/kernels/dropout.cu) against the torch-op reference on one GPU.

The kept entries must be exactly those of `hash_uniform >= p` (bit for bit, forward and
backward: the backward regenerates the mask from the seed), the values those of torch's
`x * keep / (1 - p)`; widths with and without the float4 path, row offsets past 2^32 wrap.
"""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.dropout_gpu import dropout_hash_cuda  # noqa: E402
from mgg.nn.functional import HashDropoutCUDA, hash_dropout_reference, hash_uniform  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("n,d", [(1, 1), (37, 3), (1000, 16), (513, 602), (4096, 64), (0, 8)])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("row0,seed", [(0, 1), (12345, 2 ** 61 + 99), (2 ** 32 - 10, 2 ** 40 + 3)])
def test_mask_and_output_match_torch(n, d, p, row0, seed):
    x = torch.randn(n, d, device=DEV) + 0.5  # no exact zeros in x: zeros in out are the mask
    out = dropout_hash_cuda(x, p, seed, row0)
    torch.cuda.synchronize()
    keep = hash_uniform(torch.arange(row0, row0 + n, device=DEV, dtype=torch.int64), d, seed) >= p
    assert torch.equal(out != 0, keep)
    assert torch.equal(out, hash_dropout_reference(x, p, seed, row0))


def test_unaligned_view_takes_the_scalar_path():
    base = torch.randn(65 * 8 + 1, device=DEV)
    x = base[1:].view(65, 8)  # 4-byte but not 16-byte aligned
    out = dropout_hash_cuda(x, 0.5, 7, 3)
    assert torch.equal(out, hash_dropout_reference(x, 0.5, 7, 3))


def test_backward_regenerates_the_mask():
    x = (torch.randn(300, 24, device=DEV) + 0.5).requires_grad_(True)
    g = torch.randn(300, 24, device=DEV)
    HashDropoutCUDA.apply(x, 0.4, 2 ** 50 + 1, 77).backward(g)
    xr = x.detach().clone().requires_grad_(True)
    hash_dropout_reference(xr, 0.4, 2 ** 50 + 1, 77).backward(g)
    assert torch.equal(x.grad != 0, xr.grad != 0)
    assert torch.allclose(x.grad, xr.grad, rtol=1e-6, atol=0)


def test_global_dropout_on_the_gpu_equals_the_cpu_mask():
    from mgg.nn.functional import global_dropout

    class Rows:
        lo = 40

    x = torch.randn(200, 32) + 0.5
    cpu = global_dropout(x, 0.5, Rows(), torch.Generator().manual_seed(3))
    gpu = global_dropout(x.to(DEV), 0.5, Rows(), torch.Generator().manual_seed(3))
    assert torch.equal(gpu.cpu() != 0, cpu != 0)
    assert torch.allclose(gpu.cpu(), cpu, rtol=1e-6, atol=0)


def test_device_seed_is_mix_seed_of_the_counter():
    """A seed in device memory (DeviceSeeds): the kernels use mix_seed(counter), forward, backward
    and the fused projection alike."""
    from mgg.kernels.dropout_project import project_forward, project_weight_grad
    from mgg.nn.functional import mix_seed

    x = torch.randn(777, 40, device=DEV) + 0.5
    counter = torch.tensor([2 ** 61 + 12345], dtype=torch.int64, device=DEV)
    seed = mix_seed(int(counter))
    out = torch.full_like(x, float("nan"))
    out.copy_(dropout_hash_cuda(x, 0.3, counter, 100))
    assert torch.equal(out, hash_dropout_reference(x, 0.3, seed, 100))
    w = torch.randn(16, 40, device=DEV)
    y_t, m_t = project_forward(x, w, 0.3, counter, 100, keep_mask=True)
    y_i, m_i = project_forward(x, w, 0.3, seed, 100, keep_mask=True)
    assert torch.equal(y_t, y_i) and torch.equal(m_t, m_i)
    g = torch.randn(777, 16, device=DEV)
    assert torch.equal(project_weight_grad(x, g, 0.3, counter, 100), project_weight_grad(x, g, 0.3, seed, 100))
    with pytest.raises(TypeError, match="int64 CUDA"):
        dropout_hash_cuda(x, 0.3, counter.to(torch.int32), 0)


def test_replayed_graph_draws_new_masks():
    """A dropout captured in a CUDA graph with DeviceSeeds drops new entries on every replay:
    replay k uses the counter's start + k (the masks of mix_seed(start + k))."""
    from mgg.nn.functional import DeviceSeeds, global_dropout, mix_seed

    class G:
        lo = 7

    x = torch.randn(300, 24, device=DEV) + 0.5
    seeds = DeviceSeeds(torch.Generator().manual_seed(3), DEV)
    start = int(seeds.counter)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        global_dropout(x, 0.5, G(), seeds)  # warm-up: kernel loaded; counter start + 1
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = global_dropout(x, 0.5, G(), seeds)  # recorded, not run
    masks = []
    for k in (2, 3, 4):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, hash_dropout_reference(x, 0.5, mix_seed(start + k), 7)), k
        masks.append(out != 0)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
