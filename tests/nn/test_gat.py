"""GAT and the fused aggregation path on one process (mgg.nn.conv.gat_conv, mgg.kernels.gat_cpu,
mgg.graph.adaptive, mgg.graph.halo).

Ground truth: a dense float64 masked softmax over each target's in-edges (multiplicity matrix:
duplicate edges count, the graph's self loops are replaced by exactly one when add_self_loops),
multi-head, concat and mean, differentiated by torch autograd (mgg.testing.gat_reference).
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from mgg.graph.adaptive import (NODE_CENTRIC_MIN_AVG_DEGREE, DegreeStats, choose_strategy,
                                degree_stats, fused_aggregation)
from mgg.kernels.gat_cpu import FusedCPUExecutor
from mgg.testing.reference import aggregation_matrix
from mgg.nn import GATConv, SAGEConv, aggregate, build_model
from mgg.nn.conv.gat_conv import attention_aggregate, fused_mean
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig
from mgg.graph.halo import gather_halo, scatter_halo_add
from mgg.testing.gat_reference import dense_gat_layer, multiplicity
from mgg.testing.graphs import random_csr


# ---------------------------------------------------------------------------------------------
def make_dg(n=40, e=200, seed=0, ps=4):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(ps=ps, dist=2, wpb=2, backend="cpu"))
    return dg, indptr, indices


CASES = [(h, c, sl, att) for att in ("additive", "dot") for h in (1, 3) for c in (True, False)
         for sl in (True, False)]


@pytest.mark.parametrize("heads,concat,self_loops,attention", CASES)
@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_gatconv_matches_dense_reference(heads, concat, self_loops, attention, strategy):
    dg, indptr, indices = make_dg(seed=heads + 2 * concat + 4 * self_loops)
    torch.manual_seed(0)
    conv = GATConv(7, 5, heads=heads, concat=concat, add_self_loops=self_loops, attention=attention,
                   strategy=strategy)
    with torch.no_grad():
        if conv.bias is not None:
            conv.bias.normal_()
    x = torch.randn(dg.n_local, 7, requires_grad=True)
    out = conv(x, dg)
    g = torch.randn_like(out)
    out.backward(g)
    grads = [x.grad] + [p.grad for p in conv.parameters()]

    A = multiplicity(indptr, indices, self_loops)
    xr = x.detach().double().requires_grad_(True)
    ref = dense_gat_layer(conv, xr, A)
    ref_grads = torch.autograd.grad(ref, [xr] + [p for p in conv.parameters()], g.double())
    assert (out.double() - ref).abs().max() < 1e-5
    for a, b in zip(grads, ref_grads):
        assert (a.double() - b).abs().max() < 1e-5 * max(1.0, b.abs().max().item())
    assert fused_aggregation(dg, attention, self_loops, 0.2, strategy).strategy == strategy


def test_isolated_nodes_without_self_loops_give_bias():
    indptr = np.array([0, 0, 1, 1, 3], dtype=np.int64)  # node 0, 2 isolated; 3 <- {0, 0} duplicate
    indices = np.array([3, 0, 0], dtype=np.int64)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(backend="cpu"))
    conv = GATConv(2, 3, heads=2, add_self_loops=False)
    with torch.no_grad():
        conv.bias.fill_(0.5)
    x = torch.randn(4, 2)
    out = conv(x, dg)
    assert torch.equal(out[0], torch.full((6,), 0.5)) and torch.equal(out[2], torch.full((6,), 0.5))
    # node 3 attends only to node 0 (twice): alpha = 1/2 per copy -> out = W x_0 + b
    assert torch.allclose(out[3], conv.lin(x[0]) + 0.5, atol=1e-6)
    assert torch.allclose(out[1], conv.lin(x[3]) + 0.5, atol=1e-6)


def test_float64_gradcheck_attention_aggregate():
    dg, _, _ = make_dg(n=12, e=40, seed=5, ps=2)
    n, H, C = dg.n_local, 2, 3
    for attention in ("additive", "dot"):
        for strategy in ("node", "edge"):
            feat = torch.randn(n, H, C, dtype=torch.float64, requires_grad=True)
            src = torch.randn(n, H, dtype=torch.float64, requires_grad=True)
            dst = torch.randn(n, H, dtype=torch.float64, requires_grad=True)
            if attention == "additive":
                f = lambda a, b, c: attention_aggregate(a, b, c, dg, "additive", 0.2, True, strategy=strategy)
                inputs = (feat, src, dst)
            else:
                f = lambda a: attention_aggregate(a, None, a, dg, "dot", strategy=strategy)
                inputs = (feat,)
            assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_float64_gradcheck_gatconv_parameters_and_dropout():
    dg, _, _ = make_dg(n=10, e=30, seed=7, ps=2)
    conv = GATConv(3, 2, heads=2, dropout=0.3).double()
    conv.generator = torch.Generator()
    x = torch.randn(dg.n_local, 3, dtype=torch.float64, requires_grad=True)
    params = [x] + list(conv.parameters())

    def f(*ps):
        conv.generator.manual_seed(1234)  # the same attention-dropout mask on every evaluation
        with torch.no_grad():
            for p, v in zip(conv.parameters(), ps[1:]):
                p.copy_(v)
        # differentiate w.r.t. the parameters through functional substitution
        return torch.func.functional_call(conv, dict(zip([k for k, _ in conv.named_parameters()], ps[1:])),
                                          (ps[0], dg))

    assert torch.autograd.gradcheck(f, tuple(p.detach().clone().requires_grad_(True) for p in params),
                                    eps=1e-6, atol=1e-6)
    conv.eval()  # no dropout in eval: deterministic
    assert torch.equal(conv(x, dg), conv(x, dg))


def test_node_centric_equals_edge_centric_with_chunking():
    dg, indptr, indices = make_dg(n=300, e=4000, seed=11)
    plan = dg.plan("sum")
    n, H, C = plan.n_local, 4, 8
    g = torch.Generator().manual_seed(0)
    feat = torch.randn(n, H, C, generator=g)
    src, dst = torch.randn(n, H, generator=g), torch.randn(n, H, generator=g)
    gout = torch.randn(n, H, C, generator=g)
    results = {}
    for strategy in ("node", "edge"):
        for chunk in (97, 1 << 16):  # several chunks, and one
            ex = FusedCPUExecutor(plan, "additive", True, strategy, 0.2, chunk_edges=chunk)
            assert len(ex.edges.chunks) > (1 if chunk == 97 else 0)
            out, m, den, keep = ex.forward(feat, src, dst)
            grads = ex.backward(gout, out, m, den, keep, feat, src, dst)
            results[(strategy, chunk)] = (out, *grads)
    base = results[("edge", 1 << 16)]
    for key, res in results.items():
        for a, b in zip(res, base):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), key


def test_fused_mean_matches_aggregate_and_sage_option():
    dg, indptr, indices = make_dg(n=50, e=300, seed=2)
    for strategy in ("node", "edge"):
        x = torch.randn(dg.n_local, 6, dtype=torch.float64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        a, b = fused_mean(x, dg, strategy), aggregate(x2, dg, "mean")
        gout = torch.randn_like(a)
        a.backward(gout)
        b.backward(gout)
        W = torch.from_numpy(aggregation_matrix(indptr, indices, "mean").toarray())
        assert torch.allclose(a, W @ x.detach(), atol=1e-12) and torch.allclose(x.grad, W.T @ gout, atol=1e-12)
        assert torch.allclose(a, b, atol=1e-6) and torch.allclose(x.grad, x2.grad, atol=1e-6)
    torch.manual_seed(3)
    for cin, cout in ((8, 4), (4, 8)):
        ref = SAGEConv(cin, cout)
        fused = SAGEConv(cin, cout, fused=True)
        fused.load_state_dict(ref.state_dict())
        x = torch.randn(dg.n_local, cin)
        assert torch.allclose(ref(x, dg), fused(x, dg), atol=1e-6)


def test_halo_primitives_single_process():
    dg, _, _ = make_dg(n=20, e=60)
    x = torch.randn(dg.n_local, 5)
    halo = gather_halo(dg, x)
    assert halo.shape == (0, 5)
    back = scatter_halo_add(dg, halo)
    assert back.shape == (20, 5) and not back.any()
    with pytest.raises(ValueError):
        gather_halo(dg, torch.randn(3, 5))
    with pytest.raises(ValueError):
        scatter_halo_add(dg, torch.randn(2, 5))


def test_strategy_choice_rule(monkeypatch):
    monkeypatch.delenv("MGG_GAT_STRATEGY", raising=False)
    low = DegreeStats(100, 400, 4.0, 9, 0.0)
    high = DegreeStats(100, 100 * 500, 500.0, 900, 0.0)
    skewed = DegreeStats(100, 5000, 50.0, 50 * 1000, 0.0)
    assert choose_strategy(low).strategy == "edge"
    assert choose_strategy(high).strategy == "node"
    assert choose_strategy(skewed).strategy == "edge"
    assert choose_strategy(DegreeStats(1, 32, NODE_CENTRIC_MIN_AVG_DEGREE, 32, 0.0)).strategy == "node"
    assert choose_strategy(low, force="node").reason == "forced"
    monkeypatch.setenv("MGG_GAT_STRATEGY", "node")
    assert choose_strategy(low).strategy == "node"
    monkeypatch.setenv("MGG_GAT_STRATEGY", "bogus")
    with pytest.raises(ValueError):
        choose_strategy(low)
    monkeypatch.delenv("MGG_GAT_STRATEGY")
    dg, indptr, _ = make_dg(n=30, e=90)
    st = degree_stats(dg.plan("sum"))
    assert st.edges == indptr[-1] and st.max_degree == np.diff(indptr).max()
    fa = fused_aggregation(dg, "additive")
    assert fa.strategy == "edge" and "avg degree" in fa.choice.reason  # ~3 edges per node
    assert fused_aggregation(dg, "additive") is fa  # cached per DistGraph


def test_gat_model_trains():
    dg, _, _ = make_dg(n=60, e=400, seed=4)
    torch.manual_seed(0)
    model = build_model("gat", 10, None, 3, dropout=0.0)
    assert len(model.convs) == 2 and model.convs[0].heads == 8 and model.convs[0].out_channels == 8
    x = torch.randn(dg.n_local, 10)
    y = torch.randint(0, 3, (dg.n_local,))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    gen = torch.Generator()
    losses = []
    for step in range(15):
        gen.manual_seed(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, dg, gen), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert math.isfinite(losses[-1]) and losses[-1] < losses[0]


def test_empty_graph():
    indptr = np.zeros(4, dtype=np.int64)
    dg = DistGraph(indptr, np.zeros(0, np.int64), Communicator(comm=None), RuntimeConfig(backend="cpu"))
    for sl in (True, False):
        conv = GATConv(2, 2, heads=2, add_self_loops=sl)
        x = torch.randn(3, 2, requires_grad=True)
        out = conv(x, dg)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_edge_kernel_split_slots_match_a_simulation():
    """gat_gpu.split_slots must name exactly the partial slots gat_fwd_edge writes (simulated)."""
    from mgg.graph.gat_gpu import split_slots

    rng = np.random.default_rng(0)
    for epw in (1, 3, 32):
        deg = rng.integers(0, 9, 50)
        deg[rng.integers(0, 50, 5)] = 0
        t_ptr = np.zeros(51, dtype=np.int64)
        np.cumsum(deg, out=t_ptr[1:])
        E = int(t_ptr[-1])
        written: dict[int, list[int]] = {}
        whole = set()
        for w in range(-(-E // epw)):  # the kernel's loop, warp by warp
            b, end = w * epw, min(w * epw + epw, E)
            k = b
            while k < end:
                i = int(np.searchsorted(t_ptr, k, side="right") - 1)
                run_end = min(t_ptr[i + 1], end)
                if k == t_ptr[i] and run_end == t_ptr[i + 1]:
                    whole.add(i)
                else:
                    written.setdefault(i, []).append(2 * w + (0 if k == b else 1))
                k = run_end
        split, ptr, ids = split_slots(t_ptr, epw)
        assert sorted(written) == split.tolist()
        for s, t in enumerate(split):
            assert ids[ptr[s]:ptr[s + 1]].tolist() == written[int(t)]
        assert whole.isdisjoint(written) and len(whole) + len(written) == int((deg > 0).sum())


@pytest.mark.skipif(not os.environ.get("MGG_TEST_NVCC"), reason="set MGG_TEST_NVCC=1 (and NVSHMEM_HOME) to compile-check")
def test_gat_kernels_compile(tmp_path):
    from mgg.graph.gat_gpu import build

    os.environ["MGG_KERNEL_CACHE"] = str(tmp_path)
    path = build("sm_90")
    assert os.path.getsize(path) > 0
