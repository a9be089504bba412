"""The gradient all-reduce on the device (NvshmemStore.allreduce_sum_ through
mgg.nn.allreduce_gradients) against the float64 sum of every rank's gradients.

Runs under `mpirun -np 2 python -m pytest --with-mpi tests/gpu` (at P = 1 it is a no-op and is
checked as one). Needs CUDA, cupy and nvshmem4py.
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("nvshmem.core")

from mgg.nn import allreduce_gradients  # noqa: E402
from mgg.runtime import make_store, world  # noqa: E402


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
