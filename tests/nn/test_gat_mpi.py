"""GAT / fused aggregation across ranks: `mpirun -np 2|3 python -m pytest --with-mpi
tests/nn/test_gat_mpi.py`.

Each rank computes its own targets; outputs and input gradients must equal the rows [lo, hi) of
the single-process dense float64 reference, parameter gradients (summed over ranks) the full ones.
"""
import numpy as np
import pytest
import torch

from mgg.testing.reference import aggregation_matrix
from mgg.nn import GATConv, SAGEConv, allreduce_gradients
from mgg.nn.conv.gat_conv import fused_mean
from mgg.runtime import world
from mgg.graph import DistGraph, RuntimeConfig
from mgg.graph.halo import gather_halo, scatter_halo_add
from mgg.graph.adaptive import fused_aggregation
from mgg.testing.gat_reference import dense_gat_layer, multiplicity
from mgg.testing.graphs import random_csr

pytestmark = pytest.mark.mpi(min_size=2)


def make(n, e, seed, ps=4):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, world(), RuntimeConfig(ps=ps, dist=2, wpb=2, backend="cpu"))
    return dg, indptr, indices


@pytest.mark.parametrize("heads,concat,attention", [(3, True, "additive"), (2, False, "additive"),
                                                    (2, True, "dot")])
@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_gatconv_matches_dense_reference(heads, concat, attention, strategy):
    dg, indptr, indices = make(90, 700, seed=heads)
    comm = dg.comm
    assert dg.store.name == "mpi"
    torch.manual_seed(0)  # identical parameters and inputs on every rank
    conv = GATConv(6, 4, heads=heads, concat=concat, attention=attention, strategy=strategy)
    x_all = torch.randn(dg.num_nodes, 6)
    g_all = torch.randn(dg.num_nodes, heads * 4 if concat else 4)
    x = dg.local(x_all).clone().requires_grad_(True)
    out = conv(x, dg)
    out.backward(dg.local(g_all))
    allreduce_gradients(conv, comm)
    if comm.size > 1:
        st = fused_aggregation(dg, attention, True, 0.2, strategy)
        assert comm.allreduce_scalar(st.plan.num_remote_edges) > 0  # remote rows really used

    A = multiplicity(indptr, indices, True)
    xr = x_all.double().requires_grad_(True)
    full = dense_gat_layer(conv, xr, A)
    rg = torch.autograd.grad(full, [xr] + list(conv.parameters()), g_all.double())
    assert (out.double() - dg.local(full)).abs().max() < 1e-5
    assert (x.grad.double() - dg.local(rg[0])).abs().max() < 1e-5
    for p, r in zip(conv.parameters(), rg[1:]):
        assert (p.grad.double() - r).abs().max() < 1e-5 * max(1.0, r.abs().max().item())


def test_node_equals_edge_and_fused_mean():
    dg, indptr, indices = make(150, 2000, seed=9)
    torch.manual_seed(1)
    x_all = torch.randn(dg.num_nodes, 5, dtype=torch.float64)
    g_all = torch.randn(dg.num_nodes, 5, dtype=torch.float64)
    W = torch.from_numpy(aggregation_matrix(indptr, indices, "mean").toarray())
    outs = []
    for strategy in ("node", "edge"):
        x = dg.local(x_all).clone().requires_grad_(True)
        y = fused_mean(x, dg, strategy)
        y.backward(dg.local(g_all))
        assert torch.allclose(y, dg.local(W @ x_all), atol=1e-12)
        assert torch.allclose(x.grad, dg.local(W.T @ g_all), atol=1e-12)
        conv = GATConv(5, 3, heads=2, strategy=strategy).double()
        conv.load_state_dict(GATConv(5, 3, heads=2).double().state_dict() if not outs else outs[0][2])
        xa = dg.local(x_all).clone().requires_grad_(True)
        o = conv(xa, dg)
        o.sum().backward()
        outs.append((o.detach(), xa.grad, conv.state_dict()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-12) and torch.allclose(outs[0][1], outs[1][1], atol=1e-12)
    torch.manual_seed(2)
    a, b = SAGEConv(5, 7), SAGEConv(5, 7, fused=True)
    b.load_state_dict(a.state_dict())
    x = dg.local(x_all).float()
    assert torch.allclose(a(x, dg), b(x, dg), atol=1e-5)


@pytest.mark.parametrize("n,e", [(80, 600), (2, 2)])  # (2, 2): some rank owns no node when P = 3
def test_halo_adjointness(n, e):
    dg, _, _ = make(n, e, seed=n)
    rng = np.random.default_rng(100 + dg.rank)
    plan = dg.plan("sum")
    for transposed in (False, True):
        H = dg.plan("sum", transposed).halo_size
        x = torch.from_numpy(rng.standard_normal((dg.n_local, 4)))
        g = torch.from_numpy(rng.standard_normal((H, 4)))
        gx = gather_halo(dg, x, transposed)
        sg = scatter_halo_add(dg, g, transposed)
        assert gx.shape == (H, 4) and sg.shape == (dg.n_local, 4)
        lhs = dg.comm.allreduce_scalar(float((sg * x).sum()))
        rhs = dg.comm.allreduce_scalar(float((g * gx).sum()))
        assert abs(lhs - rhs) < 1e-9 * max(1.0, abs(lhs))
    # gather really fetches the owners' rows: global id of halo row h = bounds[pe] + row
    x_all = torch.arange(dg.num_nodes * 2, dtype=torch.float32).view(-1, 2)
    halo = gather_halo(dg, dg.local(x_all).clone())
    gid = dg.bounds[plan.halo_pe()] + plan.halo_row
    assert torch.equal(halo, x_all[torch.from_numpy(gid)])
    if n == 2 and dg.world_size > 2:  # GATConv on a graph with an empty rank
        torch.manual_seed(0)
        conv = GATConv(2, 2)
        xe = dg.local(torch.randn(2, 2)).clone().requires_grad_(True)
        conv(xe, dg).sum().backward()
        assert xe.grad.shape == (dg.n_local, 2)
