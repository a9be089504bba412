"""Kernels launched on a GPU that is not the current one (mgg.kernels.launch): modules, function
handles and streams are per GPU, so a kernel first used on one GPU and then called with tensors
of another runs there and gives the same values. A module of the first GPU run on the other
GPU's stream with its pointers is an illegal memory access that fails every later test of the
P = 4 suite. Needs two GPUs; under mpirun every rank runs it and gets its own
GPU back afterwards (tests/conftest.py bound it)."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA GPUs", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.dropout_gpu import dropout_hash_cuda  # noqa: E402
from mgg.kernels.launch import blocks_for, sm_count  # noqa: E402
from mgg.kernels.norm_relu import bn_relu_forward, bn_relu_reference  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_current_gpu():
    """The tests make GPU 0 current; later tests (the rank's store) need the GPU that was."""
    was = torch.cuda.current_device()
    yield
    torch.cuda.set_device(was)


def _on_each_gpu(fn):
    """fn(device) on GPU 0 and on GPU 1, GPU 0 current throughout: the two results on the CPU."""
    torch.cuda.set_device(0)
    outs = []
    for d in (torch.device("cuda", 0), torch.device("cuda", 1)):
        out = fn(d)
        torch.cuda.synchronize(d)
        assert torch.cuda.current_device() == 0  # the launcher left the current GPU alone
        outs.append(out.cpu())
    return outs


def test_dropout_on_a_gpu_that_is_not_current():
    x = torch.randn(1000, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float32) + 0.5

    def run(dev):
        poisoned = torch.full((1000 * 24,), float("nan"), device=dev)  # free blocks hold NaNs
        del poisoned
        return dropout_hash_cuda(x.to(dev), 0.5, 12345, 7)

    a, b = _on_each_gpu(run)
    assert not torch.isnan(b).any()
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # a hash of (row, column, seed): the same bits
    assert 0.4 < (a == 0).float().mean() < 0.6


def test_batch_norm_relu_on_a_gpu_that_is_not_current():
    g = torch.Generator().manual_seed(2)
    x, mean = torch.randn(777, 64, generator=g), torch.randn(64, generator=g)
    invstd, w, b = torch.rand(64, generator=g) + 0.5, torch.randn(64, generator=g), torch.randn(64, generator=g)
    ref = bn_relu_reference(x.double(), mean.double(), invstd.double(), w.double(), b.double()).float()

    def run(dev):
        return bn_relu_forward(x.to(dev), mean.to(dev), invstd.to(dev), w.to(dev), b.to(dev))

    for out in _on_each_gpu(run):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_grid_rule_uses_the_named_gpu():
    sms = sm_count(torch.device("cuda", 1))
    assert sms == torch.cuda.get_device_properties(1).multi_processor_count
    assert blocks_for(10 ** 9, 256, torch.device("cuda", 1), 8) == sms * 8
    assert blocks_for(1, 256, 1, 8) == 1
