"""DistBatchNorm on the GPU (torch's fused batch-norm kernels: F.batch_norm on one rank, the
SyncBatchNorm kernels with the store's on-device sums on several) against float64 batch norm
over every rank's rows: outputs, input / weight / bias gradients and running statistics.

Runs at P = 1 (`python -m pytest tests/gpu`) and under `mpirun -np P ... --with-mpi tests/gpu`
(then every rank holds a slice of the same rows; one case leaves rank 0 without rows). Needs CUDA;
P > 1 also needs cupy and nvshmem4py.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mgg.nn.norm import DistBatchNorm  # noqa: E402
from mgg.runtime import world  # noqa: E402

N, D = 5003, 24


@pytest.fixture(scope="module")
def dist():
    comm = world()
    store = None
    if comm.size > 1:
        pytest.importorskip("nvshmem.core")
        from mgg.runtime import make_store

        store = make_store(comm, "gpu")
    return comm, store


def _dg(comm, store, bounds):
    return SimpleNamespace(comm=comm, store=store, bounds=np.asarray(bounds), rank=comm.rank,
                           world_size=comm.size)


def _bounds(comm, empty_first: bool):
    if comm.size == 1:
        return [0, N]
    if empty_first:  # rank 0 has no rows
        return [0, 0] + [int(v) for v in np.linspace(0, N, comm.size)[1:]]
    return [int(v) for v in np.linspace(0, N, comm.size + 1)]


def _reference(x, g, w, b, eps):
    """float64 batch norm over all N rows: y, dx, dw, db (torch on the CPU)."""
    x = torch.from_numpy(x).double().requires_grad_()
    w = torch.from_numpy(w).double().requires_grad_()
    b = torch.from_numpy(b).double().requires_grad_()
    y = F.batch_norm(x, None, None, w, b, True, 0.0, eps)
    (y * torch.from_numpy(g).double()).sum().backward()
    var = x.detach().var(0, unbiased=True)
    return y.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy(), x.detach().mean(0).numpy(), var.numpy()


def _host_sum(comm, a):
    a = np.ascontiguousarray(a, dtype=np.float64).copy()
    if comm.size > 1:
        comm.allreduce_(a)
    return a


@pytest.mark.parametrize("empty_first", [False, True])
def test_batch_norm_matches_float64(dist, empty_first):
    comm, store = dist
    if empty_first and comm.size == 1:
        pytest.skip("needs several ranks")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((N, D)) * 3.0 + rng.standard_normal(D) * 50.0).astype(np.float32)
    g = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, D).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    bounds = _bounds(comm, empty_first)
    lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
    y_ref, dx_ref, dw_ref, db_ref, mean_ref, var_ref = _reference(x, g, w, b, 1e-5)

    bn = DistBatchNorm(D).cuda()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(w))
        bn.bias.copy_(torch.from_numpy(b))
    xs = torch.full((hi - lo, D), float("nan"), device="cuda")  # poisoned, then written
    xs.copy_(torch.from_numpy(x[lo:hi]))
    xs.requires_grad_()
    y = bn(xs, _dg(comm, store, bounds))
    kind = type(y.grad_fn).__name__
    assert ("SyncBatchNormGPU" in kind) if comm.size > 1 else ("BatchNorm" in kind), kind
    (y * torch.from_numpy(g[lo:hi]).cuda()).sum().backward()
    assert np.allclose(y.detach().cpu().numpy(), y_ref[lo:hi], rtol=1e-4, atol=1e-4)
    assert np.allclose(xs.grad.cpu().numpy(), dx_ref[lo:hi], rtol=1e-3, atol=1e-4)
    # the affine gradients are this rank's rows: their sum over ranks is the whole-graph gradient
    assert np.allclose(_host_sum(comm, bn.weight.grad.cpu().numpy()), dw_ref, rtol=1e-4, atol=1e-2)
    assert np.allclose(_host_sum(comm, bn.bias.grad.cpu().numpy()), db_ref, rtol=1e-4, atol=1e-2)
    m = 0.1
    assert np.allclose(bn.running_mean.cpu().numpy(), m * mean_ref, rtol=1e-4, atol=1e-4)
    assert np.allclose(bn.running_var.cpu().numpy(), (1 - m) + m * var_ref, rtol=1e-4, atol=1e-4)
    assert int(bn.num_batches_tracked) == 1


def test_batch_norm_in_a_cuda_graph(dist):
    """Forward and backward captured once and replayed give the eager values (no host sync in
    the step: the counts are uploaded before capture, the sums stay on the device)."""
    comm, store = dist
    rng = np.random.default_rng(3)
    bounds = _bounds(comm, False)
    lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
    x = torch.from_numpy(rng.standard_normal((N, D)).astype(np.float32)[lo:hi]).cuda().requires_grad_()
    g = torch.from_numpy(rng.standard_normal((N, D)).astype(np.float32)[lo:hi]).cuda()
    bn = DistBatchNorm(D, track_running_stats=False).cuda()
    dg = _dg(comm, store, bounds)

    def step():
        x.grad = None
        y = bn(x, dg)
        (y * g).sum().backward()
        return y, x.grad

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_eager, dx_eager = (t.detach().clone() for t in step())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph, dx_graph = step()
    y_graph.detach().fill_(float("nan"))  # poisoned: the replay must write them again
    dx_graph.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y_graph.detach(), y_eager, rtol=1e-6, atol=1e-6)
    assert torch.allclose(dx_graph, dx_eager, rtol=1e-6, atol=1e-6)


def test_rows_other_than_the_ranks_are_refused(dist):
    """At P > 1 every rank must take the same path: rows that are not exactly the rank's
    partition raise (before any collective) instead of leaving the other ranks waiting."""
    comm, store = dist
    if comm.size == 1:
        pytest.skip("needs several ranks")
    bounds = _bounds(comm, False)
    bn = DistBatchNorm(D).cuda()
    x = torch.randn(bounds[comm.rank + 1] - bounds[comm.rank] + 1, D, device="cuda")
    with pytest.raises(ValueError, match="partition"):
        bn(x, _dg(comm, store, bounds))
