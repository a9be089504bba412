"""mgg.nn.allreduce_gradients with a scalar summed beside the gradients (a DLRM step's error
flags): under `mpirun -np 2|3 python -m pytest --with-mpi tests/nn/test_ddp_mpi.py` on the CPU
(MPI host all-reduce), against the float64 sums; at one rank the scalar comes back as given."""
import numpy as np
import pytest
import torch

from mgg.nn import allreduce_gradients
from mgg.runtime import Communicator, world


def _model(rank: int) -> torch.nn.ParameterList:
    rng = np.random.default_rng(10 + rank)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in [(5, 3), (3,)]])
    for p in model:
        p.grad = torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32))
    return model


@pytest.mark.mpi(min_size=2)
def test_the_extra_scalar_is_summed_with_the_gradients():
    comm = world()
    model = _model(comm.rank)
    total = allreduce_gradients(model, comm, None, extra=float(comm.rank == 1))
    assert total == 1.0
    assert allreduce_gradients(model, comm, None) is None
    want = [sum(_model(r)[i].grad.double() for r in range(comm.size)) for i in range(len(model))]
    # the second call summed the already summed gradients once more: P times the first sum
    for p, w in zip(model, want):
        np.testing.assert_allclose(p.grad.double().numpy(), comm.size * w.numpy(), rtol=1e-6, atol=1e-6)


def test_at_one_rank_the_scalar_comes_back_as_given():
    model = _model(0)
    before = [p.grad.clone() for p in model]
    flag = torch.tensor(1.0)
    assert allreduce_gradients(model, Communicator(comm=None), None, extra=flag) is flag
    assert all(torch.equal(p.grad, b) for p, b in zip(model, before))
