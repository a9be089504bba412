"""The gradient all-reduce on the device (NvshmemStore.allreduce_sum_ through
mgg.nn.allreduce_gradients and allreduce_mean_gradients) against the float64 sum (and the
count-weighted mean) of every rank's gradients.

Runs under `mpirun -np 2 python -m pytest --with-mpi tests/nn/test_ddp_gpu.py` (at P = 1 it is a
no-op and is checked as one). Needs CUDA, cupy and nvshmem4py.
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("nvshmem.core")

from mgg.nn import allreduce_gradients, allreduce_mean_gradients  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import make_store  # noqa: E402


def _grads(rank: int, shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_device_allreduce_sums_every_rank():
    comm = world()
    store = make_store(comm, "gpu")
    shapes = [(602, 16), (16,), (16, 41), (41,)]
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in shapes])
    for _ in range(2):  # the scratch vectors are reused
        for p, g in zip(model, _grads(comm.rank, shapes)):
            p.grad = torch.from_numpy(g).cuda()
        allreduce_gradients(model, comm, store)
        want = [sum(_grads(r, shapes)[i].astype(np.float64) for r in range(comm.size)) for i in range(len(shapes))]
        for p, w in zip(model, want):
            got = p.grad.cpu().numpy()
            assert got.dtype == np.float32 and np.allclose(got, w, rtol=1e-6, atol=1e-6)
    assert store.allreduce_sum_(torch.zeros(3, dtype=torch.float64, device="cuda")) is False


def test_device_mean_allreduce_divides_by_the_summed_count():
    """Each rank holds the gradient of a summed loss of rank + 1 terms (rank 0: 0 terms at
    P > 1): the result is the sum over ranks divided by the summed count, computed on the GPU
    (the count comes back as a device tensor)."""
    comm = world()
    store = make_store(comm, "gpu")
    shapes = [(33, 7), (7,)]
    counts = [0 if (r == 0 and comm.size > 1) else r + 1 for r in range(comm.size)]
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in shapes])
    for p, g in zip(model, _grads(comm.rank, shapes)):
        p.grad = torch.from_numpy(g).cuda()
    total = allreduce_mean_gradients(model, comm, counts[comm.rank], store)
    assert float(total) == sum(counts)
    if comm.size > 1:
        assert isinstance(total, torch.Tensor) and total.is_cuda
    for i, p in enumerate(model):
        want = sum(_grads(r, shapes)[i].astype(np.float64) for r in range(comm.size)) / sum(counts)
        assert np.allclose(p.grad.cpu().numpy(), want, rtol=1e-6, atol=1e-6)
