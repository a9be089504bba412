"""DistBatchNorm on the GPU (torch's fused batch-norm kernels: F.batch_norm on one rank, the
SyncBatchNorm kernels with the store's on-device sums on several; with `relu=True` the
batch-norm + ReLU kernels of mgg/kernels/norm_relu.cu) against float64 batch norm over every
rank's rows: outputs, input / weight / bias gradients and running statistics.

Runs at P = 1 (`python -m pytest tests/nn/test_norm_gpu.py`) and under `mpirun -np P ... --with-mpi
tests/nn/test_norm_gpu.py` (then every rank holds a slice of the same rows; one case leaves rank 0 without rows).
Needs CUDA; P > 1 also needs cupy and nvshmem4py.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mgg.nn.norm import DistBatchNorm  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.testing.batch_norm import host_sum, norm_graph  # noqa: E402
from mgg.testing.dense_gin import dense_gin_input  # noqa: E402

N, D = 5003, 24


@pytest.fixture(scope="module")
def dist():
    comm = world()
    store = None
    if comm.size > 1:
        pytest.importorskip("nvshmem.core")
        from mgg.graph import make_store

        store = make_store(comm, "gpu")
    return comm, store


def _bounds(comm, empty_first: bool):
    if comm.size == 1:
        return [0, N]
    if empty_first:  # rank 0 has no rows
        return [0, 0] + [int(v) for v in np.linspace(0, N, comm.size)[1:]]
    return [int(v) for v in np.linspace(0, N, comm.size + 1)]


def _reference(x, g, w, b, eps, relu=False):
    """float64 batch norm (then ReLU with `relu`) over all N rows: y, dx, dw, db, mean, unbiased
    var (torch on the CPU)."""
    x = torch.from_numpy(x).double().requires_grad_()
    w = torch.from_numpy(w).double().requires_grad_()
    b = torch.from_numpy(b).double().requires_grad_()
    y = F.batch_norm(x, None, None, w, b, True, 0.0, eps)
    if relu:
        y = torch.relu(y)
    (y * torch.from_numpy(g).double()).sum().backward()
    var = x.detach().var(0, unbiased=True)
    return y.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy(), x.detach().mean(0).numpy(), var.numpy()


def _check(comm, bn, y, y_ref, xs, dx_ref, dw_ref, db_ref, mean_ref, var_ref, m=0.1):
    """y and x's gradient against this rank's float64 rows; the affine gradients (this rank's
    rows: their sum over ranks is the whole-graph gradient) and the running statistics (one
    update with momentum m) against the whole graph's."""
    assert np.allclose(y.detach().cpu().numpy(), y_ref, rtol=1e-4, atol=1e-4)
    assert np.allclose(xs.grad.cpu().numpy(), dx_ref, rtol=1e-3, atol=1e-4)
    assert np.allclose(host_sum(comm, bn.weight.grad.cpu().numpy()), dw_ref, rtol=1e-4, atol=1e-2)
    assert np.allclose(host_sum(comm, bn.bias.grad.cpu().numpy()), db_ref, rtol=1e-4, atol=1e-2)
    assert np.allclose(bn.running_mean.cpu().numpy(), m * mean_ref, rtol=1e-4, atol=1e-4)
    assert np.allclose(bn.running_var.cpu().numpy(), (1 - m) + m * var_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("empty_first", [False, True])
def test_batch_norm_matches_float64(dist, empty_first, relu):
    comm, store = dist
    if empty_first and comm.size == 1:
        pytest.skip("needs several ranks")
    d = 32 if relu else D  # the fused kernels take D = 4 * 2^k; D = 24 is the two-step path
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((N, d)) * 3.0 + rng.standard_normal(d) * 50.0).astype(np.float32)
    g = rng.standard_normal((N, d)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, d).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    bounds = _bounds(comm, empty_first)
    lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
    y_ref, dx_ref, dw_ref, db_ref, mean_ref, var_ref = _reference(x, g, w, b, 1e-5, relu)

    bn = DistBatchNorm(d).cuda()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(w))
        bn.bias.copy_(torch.from_numpy(b))
    xs = torch.full((hi - lo, d), float("nan"), device="cuda")  # poisoned, then written
    xs.copy_(torch.from_numpy(x[lo:hi]))
    xs.requires_grad_()
    y = bn(xs, norm_graph(comm, store, bounds), relu=relu)
    kind = type(y.grad_fn).__name__
    assert ("SyncBatchNormGPU" in kind) if (comm.size > 1 or relu) else ("BatchNorm" in kind), kind
    (y * torch.from_numpy(g[lo:hi]).cuda()).sum().backward()
    if relu:
        assert (y_ref == 0).mean() > 0.2  # the mask matters
    _check(comm, bn, y, y_ref[lo:hi], xs, dx_ref[lo:hi], dw_ref, db_ref, mean_ref, var_ref)
    assert int(bn.num_batches_tracked) == 1


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("share", [0.0, 0.08, 1.0])
def test_batch_norm_of_some_rows_matches_float64(dist, relu, share):
    """`rows=`: statistics over every row of every rank, only the given rows written (the last GIN
    layer's training rows); the gradient (the loss reads those rows alone) reaches every row
    through the statistics. float64 reference: the full batch norm, g zero off the rows."""
    comm, store = dist
    d = 32 if relu else D
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((N, d)) * 3.0 + rng.standard_normal(d) * 50.0).astype(np.float32)
    pick = rng.random(N) < share
    if share == 1.0:
        pick[:] = True
    g = rng.standard_normal((N, d)).astype(np.float32) * pick[:, None]
    w = rng.uniform(0.5, 1.5, d).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    bounds = _bounds(comm, False)
    lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
    y_ref, dx_ref, dw_ref, db_ref, mean_ref, var_ref = _reference(x, g, w, b, 1e-5, relu)
    mine = np.nonzero(pick[lo:hi])[0]
    rows = torch.from_numpy(rng.permutation(mine)).cuda()  # any order: the output follows it
    bn = DistBatchNorm(d).cuda()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(w))
        bn.bias.copy_(torch.from_numpy(b))
    xs = torch.from_numpy(x[lo:hi]).cuda().requires_grad_()
    y = bn(xs, norm_graph(comm, store, bounds), relu=relu, rows=rows)
    assert "SyncBatchNormGPU" in type(y.grad_fn).__name__ and y.shape == (len(mine), d)
    r = rows.cpu().numpy()
    (y * torch.from_numpy(g[lo:hi][r]).cuda()).sum().backward()
    _check(comm, bn, y, y_ref[lo:hi][r], xs, dx_ref[lo:hi], dw_ref, db_ref, mean_ref, var_ref)


@pytest.mark.parametrize("d", [4, 64, 1024])
@pytest.mark.parametrize("affine", [True, False])
def test_bn_relu_kernels_match_float64(d, affine):
    """The three kernels alone against their math in float64 (bn_relu_reference), outputs
    poisoned first; rows that are not a multiple of a block, entries exactly at the ReLU's edge."""
    from mgg.kernels.norm_relu import (bn_relu_backward_elemt, bn_relu_backward_reduce, bn_relu_forward,
                                       bn_relu_reference, supports)

    gen = torch.Generator(device="cuda").manual_seed(d)
    n = 3001
    x = torch.randn(n, d, device="cuda", generator=gen) * 2 + 1
    dy = torch.randn(n, d, device="cuda", generator=gen)
    mean, invstd = x.mean(0), torch.rsqrt(x.var(0, unbiased=False) + 1e-5)
    w = torch.rand(d, device="cuda", generator=gen) + 0.5 if affine else None
    b = torch.randn(d, device="cuda", generator=gen) if affine else None
    x[:7] = mean  # t = b exactly (0 without affine): the ReLU's edge, masked as torch masks it
    assert supports(x) and not supports(x[:, :d - 1].contiguous() if d > 4 else x.double())
    args64 = [t.double() if t is not None else None for t in (x, mean, invstd, w, b)]
    y_ref = bn_relu_reference(*args64)
    s_dy, s_xmu, _ = bn_relu_reference(*args64, dy=dy.double())
    sums = (s_dy * 0.5, s_xmu * 2.0)  # as if summed over ranks: not this x's own
    dx_ref = bn_relu_reference(*args64, dy=dy.double(), count=2 * n, sums=sums)[2]
    y = bn_relu_forward(x, mean, invstd, w, b)
    x64, m64, is64 = args64[:3]
    t_ref = (x64 - m64) * is64 * (args64[3] if affine else 1.0) + (args64[4] if affine else 0.0)
    t = bn_relu_forward(x, mean, invstd, w, b, relu=False)  # the transform alone (mgg_bn_forward)
    assert torch.allclose(t.double(), t_ref, rtol=1e-5, atol=1e-5) and (t < 0).any()
    r_dy, r_xmu = bn_relu_backward_reduce(dy, x, mean, invstd, w, b)
    dx = bn_relu_backward_elemt(dy, x, mean, invstd, w, b, sums[0].float(), sums[1].float(), 2 * n)
    assert torch.allclose(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(r_dy.double(), s_dy, rtol=1e-4, atol=1e-3)
    assert torch.allclose(r_xmu.double(), s_xmu, rtol=1e-4, atol=1e-3)
    assert torch.allclose(dx.double(), dx_ref, rtol=1e-4, atol=1e-5)
    if not affine:  # t == 0 exactly: no output, and only the mean terms in dx (allclose above)
        assert (y[:7] == 0).all()


def test_bn_relu_refuses_what_it_cannot_take():
    from mgg.kernels.norm_relu import bn_relu_forward

    x = torch.randn(10, 24, device="cuda")
    with pytest.raises(ValueError, match="D = 4"):
        bn_relu_forward(x, x.mean(0), x.std(0), None, None)
    x = torch.randn(10, 8, device="cuda")
    with pytest.raises(ValueError, match="mean must have shape"):
        bn_relu_forward(x, x.mean(), x.std(0), None, None)


def test_gin_with_fused_norm_relu_matches_the_two_steps(monkeypatch):
    """GIN (batch norm, the default) forward and backward with the fused kernels equal the same
    model with fuse_relu off, in float32 rounding; the fused path is taken."""
    from mgg.nn import GIN

    x, graph = dense_gin_input(monkeypatch)

    import mgg.kernels.norm_relu as kernels

    calls = []
    real = kernels.bn_relu_forward
    monkeypatch.setattr(kernels, "bn_relu_forward", lambda *a: calls.append(1) or real(*a))
    outs = []
    for fuse in (True, False):
        torch.manual_seed(0)
        model = GIN(12, 32, 5, layers=3, dropout=0.0).cuda()
        model.cache_input_aggregation = False
        for mod in model.modules():
            if isinstance(mod, DistBatchNorm):
                mod.fuse_relu = fuse
        out = model(x, graph)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in model.parameters()], len(calls)))
    # fused: the norms of width 32 (two MLPs', two after the hidden layers; the last MLP's norm
    # has the 5 classes' width, which the kernels do not take), then none
    assert outs[0][2] == 4 and outs[1][2] == 4
    assert torch.allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
    for a, b in zip(outs[0][1], outs[1][1]):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-3)


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
    dg = norm_graph(comm, store, bounds)

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
        bn(x, norm_graph(comm, store, bounds))
