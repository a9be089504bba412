"""Fused GAT / mean kernels on the GPU (mgg/kernels/gat_fused.cu) vs the dense float64 reference.

Runs alone (P = 1) and under `mpirun -np 2 python -m pytest tests/nn/test_gat_gpu.py` (P = 2);
skipped without CUDA, cupy and nvshmem4py. Outputs, input gradients and the (rank-summed) parameter
gradients of GATConv must equal the dense masked-softmax reference of tests/nn/test_gat.py within
1e-5 (relative to the largest entry), for both strategies (node- and edge-centric) and both
attentions.
"""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

from mgg.graph.adaptive import fused_aggregation  # noqa: E402
from mgg.nn import GATConv, allreduce_gradients  # noqa: E402
from mgg.nn.conv.gat_conv import fused_mean  # noqa: E402
from mgg.nn.functional import aggregate  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig  # noqa: E402
from mgg.testing.gat_reference import dense_gat_layer, multiplicity  # noqa: E402
from mgg.testing.graphs import random_csr  # noqa: E402


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return bool(torch.isfinite(a).all()) and float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def make(n: int, e: int, seed: int, ps: int = 4):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, world(), RuntimeConfig(ps=ps, dist=2, wpb=2, backend="gpu"))
    assert dg.device.type == "cuda"
    return dg, indptr, indices


#: (heads, out channels per head, concat, attention): the edge path's column-per-lane form runs
#: additive attention with one head or C dividing 32 (8 x 8: two column slots a lane; 1 x 40:
#: one head wider than the warp); 2 x 6 and dot run the per-head form
CONVS = [(1, 8, True, "additive"), (3, 8, True, "additive"), (2, 8, False, "additive"), (2, 8, True, "dot"),
         (8, 8, True, "additive"), (1, 40, True, "additive"), (2, 6, True, "additive")]


@pytest.mark.parametrize("heads,out_ch,concat,attention", CONVS)
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("self_loops", [True, False])
def test_gatconv_gpu_matches_dense_reference(heads, out_ch, concat, attention, strategy, self_loops):
    dg, indptr, indices = make(300, 4000, seed=heads + 7 * self_loops)
    with dg:
        comm = dg.comm
        torch.manual_seed(0)  # identical parameters and inputs on every rank
        conv = GATConv(12, out_ch, heads=heads, concat=concat, attention=attention, strategy=strategy,
                       add_self_loops=self_loops)
        with torch.no_grad():
            conv.bias.normal_()
        x_all = torch.randn(dg.num_nodes, 12)
        g_all = torch.randn(dg.num_nodes, heads * out_ch if concat else out_ch)
        conv = conv.cuda()
        x = dg.local(x_all).clone().cuda().requires_grad_(True)
        out = conv(x, dg)
        out.backward(dg.local(g_all).cuda())
        allreduce_gradients(conv, comm)
        st = fused_aggregation(dg, attention, self_loops, 0.2, strategy)
        assert st.strategy == strategy and type(st.impl).__name__ == "GATGPUExecutor"
        if comm.size > 1:
            assert comm.allreduce_scalar(st.plan.num_remote_edges) > 0

        A = multiplicity(indptr, indices, self_loops)
        conv_cpu = conv.cpu()
        xr = x_all.double().requires_grad_(True)
        full = dense_gat_layer(conv_cpu, xr, A)
        rg = torch.autograd.grad(full, [xr] + list(conv_cpu.parameters()), g_all.double())
        assert close(out, dg.local(full))
        assert close(x.grad, dg.local(rg[0]))
        for p, r in zip(conv_cpu.parameters(), rg[1:]):
            assert close(p.grad, r), p.shape


@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_gpu_equals_cpu_executor_with_high_degree(strategy):
    """A denser graph (avg degree ~60, rows longer than one partition and one edge chunk)."""
    indptr, indices = random_csr(400, 24000, seed=3)
    torch.manual_seed(2)
    x_all = torch.randn(400, 16)
    g_all = torch.randn(400, 4 * 8)
    res = {}
    for backend in ("cpu", "gpu"):
        with DistGraph(indptr, indices, world(), RuntimeConfig(8, 2, 4, backend=backend)) as dg:
            torch.manual_seed(5)
            conv = GATConv(16, 8, heads=4, strategy=strategy).to(dg.device)
            x = dg.local(x_all).clone().to(dg.device).requires_grad_(True)
            out = conv(x, dg)
            out.backward(dg.local(g_all).to(dg.device))
            res[backend] = (out.detach().cpu(), x.grad.cpu(), conv.lin.weight.grad.cpu())
    for a, b in zip(res["gpu"], res["cpu"]):
        assert close(a, b, 1e-4)


@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_fused_mean_gpu_equals_aggregate(strategy):
    dg, indptr, indices = make(500, 6000, seed=11)
    with dg:
        x_all = torch.randn(dg.num_nodes, 20)
        g_all = torch.randn(dg.num_nodes, 20)
        x1 = dg.local(x_all).clone().cuda().requires_grad_(True)
        x2 = dg.local(x_all).clone().cuda().requires_grad_(True)
        a = fused_mean(x1, dg, strategy)
        b = aggregate(x2, dg, "mean")
        a.backward(dg.local(g_all).cuda())
        b.backward(dg.local(g_all).cuda())
        assert close(a, b) and close(x1.grad, x2.grad)
