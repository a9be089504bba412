"""DistBatchNorm and GIN(norm="batch") over P ranks: `mpirun -np 2|3 python -m pytest --with-mpi
tests/nn/test_norm_mpi.py`.

Every rank also runs the 1-rank computation (single-process communicator) on the same global
data and compares its own rows: outputs, input gradients and summed parameter gradients must
agree to float64 rounding, i.e. the batch statistics really are those of the whole graph. The
graph of 2 nodes on 3 ranks leaves a rank without rows (it still joins every all-reduce).
"""
import numpy as np
import pytest
import torch

from mgg.nn import GIN, allreduce_gradients
from mgg.nn.norm import DistBatchNorm
from mgg.runtime import Communicator, world
from mgg.graph import DistGraph, RuntimeConfig
from mgg.testing.graphs import random_csr

pytestmark = pytest.mark.mpi(min_size=2)


def _max_over_ranks(comm, value):
    # every rank takes the same branch, so a failure on one rank cannot hang the others
    return comm.allreduce_scalar(float(value), "max")


def _run_bn(dg, x_all, g_all, weight, bias, steps=2):
    bn = DistBatchNorm(x_all.shape[2]).double()  # x_all: [steps, n, D]
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    outs, grads = [], []
    for s in range(steps):
        x = torch.from_numpy(dg.local(x_all[s]).copy()).requires_grad_(True)
        out = bn(x, dg)
        out.backward(torch.from_numpy(dg.local(g_all[s]).copy()))
        outs.append(out.detach())
        grads.append(x.grad)
    allreduce_gradients(bn, dg.comm)
    bn.eval()
    ev = bn(torch.from_numpy(dg.local(x_all[0]).copy()), dg)
    return outs, grads, bn.weight.grad, bn.bias.grad, ev, bn.running_mean, bn.running_var


@pytest.mark.parametrize("n,e", [(60, 300), (2, 2)])
def test_dist_batch_norm_p_ranks_equal_one_rank(n, e):
    comm = world()
    indptr, indices = random_csr(n, e, seed=n, isolated=0, self_loops=0, duplicates=0)
    rng = np.random.default_rng(1)
    x_all = rng.standard_normal((2, n, 5)) * 3 + 1
    g_all = rng.standard_normal((2, n, 5))
    w, b = torch.linspace(0.5, 2.0, 5, dtype=torch.float64), torch.linspace(-1, 1, 5, dtype=torch.float64)
    cfg = RuntimeConfig(backend="cpu")
    with DistGraph(indptr, indices, comm, cfg) as dg:
        got = _run_bn(dg, x_all, g_all, w, b)
        lo, hi = dg.lo, dg.hi
    with DistGraph(indptr, indices, Communicator(comm=None), cfg) as dg1:
        ref = _run_bn(dg1, x_all, g_all, w, b)
    diffs = []
    for k in (0, 1):  # per-row quantities: this rank's rows of the 1-rank result
        diffs += [(a - r[lo:hi]).abs().max().item() if a.numel() else 0.0 for a, r in zip(got[k], ref[k])]
    diffs.append((got[4] - ref[4][lo:hi]).abs().max().item() if got[4].numel() else 0.0)
    diffs += [(got[k] - ref[k]).abs().max().item() for k in (2, 3, 5, 6)]  # replicated quantities
    assert _max_over_ranks(comm, max(diffs)) < 1e-10
    # and it is not trivially true: the rows differ from a per-rank normalisation
    if n > 2:
        x0 = torch.from_numpy(x_all[0][lo:hi])
        per_rank = (x0 - x0.mean(0)) / torch.sqrt(x0.var(0, unbiased=False) + 1e-5) * w + b
        gap = (got[0][0] - per_rank).abs().max().item()
        assert comm.allreduce_scalar(gap, "min") > 1e-3


def _gin_step(dg, x_all, seed):
    torch.manual_seed(0)
    model = GIN(x_all.shape[1], 8, 3, layers=3, dropout=0.5, norm="batch").double()
    x = torch.from_numpy(dg.local(x_all).copy()).requires_grad_(True)
    out = model(x, dg, torch.Generator().manual_seed(seed))
    (out * torch.arange(1.0, 4.0, dtype=torch.float64)).square().sum().backward()
    allreduce_gradients(model, dg.comm)
    model.eval()
    ev = model(torch.from_numpy(dg.local(x_all).copy()), dg, None)
    return out.detach(), x.grad, [p.grad for p in model.parameters()], ev


def test_gin_batch_norm_p_ranks_equal_one_rank():
    comm = world()
    n = 80
    indptr, indices = random_csr(n, 500, seed=3)
    x_all = np.random.default_rng(2).standard_normal((n, 6))
    cfg = RuntimeConfig(ps=4, dist=2, wpb=2, backend="cpu")
    with DistGraph(indptr, indices, comm, cfg) as dg:
        out, gx, gp, ev = _gin_step(dg, x_all, 7)
        lo, hi = dg.lo, dg.hi
    with DistGraph(indptr, indices, Communicator(comm=None), cfg) as dg1:
        out1, gx1, gp1, ev1 = _gin_step(dg1, x_all, 7)
    diffs = [(out - out1[lo:hi]).abs().max().item(), (gx - gx1[lo:hi]).abs().max().item(),
             (ev - ev1[lo:hi]).abs().max().item()]
    diffs += [(a - b).abs().max().item() for a, b in zip(gp, gp1)]
    assert _max_over_ranks(comm, max(diffs)) < 1e-9
