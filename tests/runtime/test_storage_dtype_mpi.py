"""--storage-dtype bf16 / fp16 over MPI-RMA windows: `mpirun -np 2 python -m pytest --with-mpi
tests/runtime/test_storage_dtype_mpi.py`.

The windows hold raw 16-bit words (uint16); P ranks must aggregate exactly the rounded rows one
rank aggregates (float64 oracle on rounded inputs, float32 summation-order tolerance), and train
the one-rank weights.
"""
import numpy as np
import pytest
import torch

from mgg.runtime import Communicator, world
from mgg.graph import DistGraph, RuntimeConfig
from mgg.runtime.store import MPIStore, storage_torch_dtype
from mgg.testing.reference import aggregate_reference
from mgg.testing.graphs import cached_dataset, random_csr

pytestmark = pytest.mark.mpi(min_size=2)


def rel_err(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_window_moves_16_bit_rows_bit_exactly(name):
    comm = world()
    dt = storage_torch_dtype(name)
    arr = MPIStore(comm).allocate(5, 3, dt)
    try:
        x = (torch.arange(15, dtype=torch.float32).reshape(5, 3) + 0.1 + 100 * comm.rank) / 7
        arr.write(x)
        arr.publish()
        peer = (comm.rank + 1) % comm.size
        got = arr.get_rows(peer, np.array([4, 1]))
        halo = arr.get_halo(np.r_[np.zeros(peer + 1, np.int64), np.full(comm.size - peer, 2)], np.array([0, 3]))
        arr.release()
    finally:
        arr.free()
    px = (torch.arange(15, dtype=torch.float32).reshape(5, 3) + 0.1 + 100 * peer) / 7
    assert got.dtype == dt and halo.dtype == dt
    assert torch.equal(got.view(torch.int16), px[[4, 1]].to(dt).view(torch.int16))
    assert torch.equal(halo.view(torch.int16), px[[0, 3]].to(dt).view(torch.int16))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("transposed", [False, True])
def test_p_ranks_aggregate_the_rounded_rows(name, kind, transposed):
    comm = world()
    indptr, indices = random_csr(500, 7000, seed=4)
    x = np.random.default_rng(6).standard_normal((500, 19)).astype(np.float32)
    cfg = RuntimeConfig(backend="cpu", ps=4, dist=2, wpb=2, storage_dtype=name)
    with DistGraph(indptr, indices, comm, cfg) as dg:
        out = dg.aggregate(torch.from_numpy(dg.local(x).copy()), kind, transposed).numpy()
        lo, hi = dg.lo, dg.hi
        remote = dg.plan(kind, transposed).num_remote_edges
    xr = torch.from_numpy(x).to(storage_torch_dtype(name)).double().numpy()
    ref = aggregate_reference(indptr, indices, xr, kind, transposed)[lo:hi]
    err = comm.allreduce_scalar(rel_err(out, ref), "max")
    assert comm.allreduce_scalar(float(remote), "min") > 0  # every rank read 16-bit rows of others
    assert err < 1e-5


def flat(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).numpy()


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("name", ["bf16"])
def test_p_ranks_train_the_one_rank_weights_in_16_bits(model, name):
    from mgg.train import TrainConfig, train

    comm = world()
    g = cached_dataset("sbm")
    cfg = TrainConfig(dataset="sbm", model=model, epochs=10, backend="cpu", ps=4, dist=2, wpb=2,
                      progress=False, storage_dtype=name)
    res = train(cfg, comm, g)
    ref = train(cfg, Communicator(comm=None), g)
    # the same rounding points (every row rounded once, in the store); only float32 summation
    # order differs, which can flip a 16-bit rounding of a later layer's input now and then.
    # Measured at P=2: gcn 3.9e-07, sage 2.2e-05; the bound is the fp32 test's (test_train_mpi)
    diff = comm.allreduce_scalar(float(np.abs(flat(res.model) - flat(ref.model)).max()), "max")
    print(f"{model} {name} P={comm.size}: max |w_P - w_1| = {diff:.2e}")
    assert diff < 1e-4 * max(1.0, float(np.abs(flat(ref.model)).max()))
    assert abs(res.final_loss - ref.final_loss) < 1e-3
    assert np.array_equal(flat(res.model), comm.bcast(flat(res.model)))
