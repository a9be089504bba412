"""mgg/kernels/dropout_project.cu: the fused dropout + projection and its weight gradient against
float64 (the dropout mask from the torch-op reference of the hash dropout), and GCN/GIN with the
fused input layer against the same models without it."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.dropout_project import project_forward, project_weight_grad, supports  # noqa: E402
from mgg.nn.functional import hash_dropout_reference  # noqa: E402


@pytest.mark.parametrize("f,o", [(128, 16), (128, 7), (64, 32), (256, 16), (12, 3), (200, 8)])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_kernels_match_float64(f, o, p):
    torch.manual_seed(0)
    n, seed, row0 = 3001, 12345678901, 77
    x = torch.randn(n, f, device="cuda")
    w = torch.randn(o, f, device="cuda")
    g = torch.randn(n, o, device="cuda")
    assert supports(x, o)
    xd = hash_dropout_reference(x, p, seed, row0).double() if p > 0 else x.double()
    out = project_forward(x, w, p, seed, row0)
    torch.testing.assert_close(out.double(), xd @ w.double().t(), rtol=1e-4, atol=1e-3)
    gw = project_weight_grad(x, g, p, seed, row0)
    assert gw.shape == (o, f)
    torch.testing.assert_close(gw.double(), g.double().t() @ xd, rtol=1e-4, atol=1e-2)
    out2, mask = project_forward(x, w, p, seed, row0, keep_mask=True)
    assert torch.equal(out2, out)
    if p == 0:
        assert mask is None
        return
    # the keep bits are the reference mask, and the gradient from them is the hashed one exactly
    bits = (mask.unsqueeze(-1) >> torch.arange(32, device="cuda", dtype=torch.int32)) & 1
    keep = hash_dropout_reference(torch.ones_like(x), p, seed, row0) != 0
    assert torch.equal(bits.reshape(n, -1)[:, :f].bool(), keep)
    assert not bits.reshape(n, -1)[:, f:].any()
    assert torch.equal(project_weight_grad(x, g, p, seed, row0, mask=mask), gw)
    with pytest.raises(ValueError, match="keep bits"):
        project_weight_grad(x, g, p, seed, row0, mask=mask[:-1])


@pytest.mark.parametrize("f,o", [(128, 16), (256, 8)])
def test_kernels_grid_stride_over_many_rows(f, o):
    """More rows than one sweep of the grid: the forward's grid-stride loop and the weight
    gradient's tile loop both wrap (n > SMs x blocks per SM x rows per block)."""
    from mgg.kernels import dropout_project as dp

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = max(sms * dp.FWD_BLOCKS_PER_SM * dp.FWD_THREADS, sms * dp.WGRAD_BLOCKS_PER_SM * dp.WGRAD_TILE[f // 128]) * 2 + 37
    torch.manual_seed(1)
    x, w, g = torch.randn(n, f, device="cuda"), torch.randn(o, f, device="cuda"), torch.randn(n, o, device="cuda")
    out, mask = project_forward(x, w, 0.5, 99, 5, keep_mask=True)
    xd = hash_dropout_reference(x, 0.5, 99, 5).double()
    torch.testing.assert_close(out.double(), xd @ w.double().t(), rtol=1e-4, atol=1e-3)
    gw = project_weight_grad(x, g, 0.5, 99, 5)
    torch.testing.assert_close(gw.double(), g.double().t() @ xd, rtol=1e-4, atol=5e-2)
    assert torch.equal(project_weight_grad(x, g, 0.5, 99, 5, mask=mask), gw)


def test_unsupported_shapes_are_refused():
    x = torch.randn(10, 130, device="cuda")
    assert not supports(x, 16)                                   # F % 4
    assert not supports(torch.randn(10, 260, device="cuda"), 8)  # F > 256
    assert not supports(torch.randn(10, 256, device="cuda"), 32)  # 32 outputs x 2 column blocks


@pytest.mark.parametrize("model", ["gcn", "gin"])
def test_models_with_the_fused_input_layer_match(model, monkeypatch):
    from mgg.nn import build_model, dense
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig
    from mgg.testing.graphs import random_csr

    indptr, indices = random_csr(2000, 30000, seed=3)
    # GIN drops out between layers only; input_dropout puts its first layer through the fused path
    opts = {"norm": "none", "input_dropout": True} if model == "gin" else {}
    results = []
    with DistGraph(indptr, indices, world(), RuntimeConfig(backend="gpu")) as dg:
        torch.manual_seed(1)  # on this rank's GPU (the store set it): not GPU 0 on every rank
        x = torch.randn(2000, 128, device=dg.device)
        y = torch.randint(0, 5, (2000,), device=dg.device)
        xl = x[dg.lo:dg.hi].contiguous()
        for tall in (1 << 40, 0):  # unfused, then fused (every input counts as tall)
            monkeypatch.setattr(dense, "TALL_ROWS", tall)
            torch.manual_seed(2)
            m = build_model(model, 128, 16, 5, 2, 0.5, **opts).cuda()
            gen = torch.Generator().manual_seed(9)
            out = m(xl, dg, gen)
            torch.nn.functional.cross_entropy(out, y[dg.lo:dg.hi]).backward()
            after = int(torch.randint(0, 1 << 30, (1,), generator=gen))  # the same draws were made
            results.append((out.detach(), [p.grad.clone() for p in m.parameters()], after))
    (o1, g1, a1), (o2, g2, a2) = results
    assert a1 == a2
    torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-4)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("model", ["gcn", "gin"])
def test_training_replayed_from_a_cuda_graph_matches_eager(model):
    """--cuda-graph with dropout: GCN/GIN trained 4 steps eagerly with seeds on the device
    (DeviceSeeds) and the same 4 steps with steps 2-4 replayed from a graph (CapturedStep, as
    the CLI does) give the same losses and weights: each replay draws the next seeds."""
    from mgg.apps.graphed import CapturedStep
    from mgg.nn import allreduce_gradients, build_model
    from mgg.nn.functional import DeviceSeeds
    from mgg.nn.optim import Adam
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig
    from mgg.testing.graphs import random_csr

    comm = world()
    indptr, indices = random_csr(3000, 40000, seed=4)
    # GIN drops out between layers only; input_dropout puts its first layer through the fused path
    opts = {"norm": "none", "input_dropout": True} if model == "gin" else {}
    runs = []
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu")) as dg:
        # made on this rank's GPU, which the store selects: a tensor made before it was on GPU 0 on
        # every rank, and at P = 2 rank 1's kernels then read GPU 0's memory (the illegal address
        # of 2026-11-25-h200x2-04bbd23/c7.txt, most likely)
        torch.manual_seed(1)
        x = torch.randn(3000, 128, device=dg.device)
        y = torch.randint(0, 5, (3000,), device=dg.device)
        xl, yl = x[dg.lo:dg.hi].contiguous(), y[dg.lo:dg.hi].contiguous()
        for graphed in (False, True):
            torch.manual_seed(2)
            m = build_model(model, 128, 16, 5, 2, 0.5, **opts).cuda()
            opt = Adam(m.parameters(), lr=0.01, capturable=True)
            seeds = DeviceSeeds(torch.Generator().manual_seed(9), dg.device)

            def step(epoch):
                opt.zero_grad(set_to_none=False)
                loss = torch.nn.functional.cross_entropy(m(xl, dg, seeds), yl, reduction="sum") / 3000
                loss.backward()
                allreduce_gradients(m, comm, dg.store)
                opt.step()
                return loss.detach()

            run = CapturedStep(step, comm, warmup=1) if graphed else step
            losses = [float(run(e)) for e in range(1, 5)]
            if graphed:
                assert run.captured, run.why_eager
            runs.append((losses, [p.detach().clone() for p in m.parameters()], int(seeds.counter)))
    (l1, w1, c1), (l2, w2, c2) = runs
    assert c1 == c2  # as many seeds drawn
    assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-6)
    for a, b in zip(w1, w2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scaled", [False, True])
def test_dropout_project_gradients_through_x_match_float64(scaled):
    """dropout_project's backward when x itself needs a gradient (an input that is not a leaf of
    features: grad x = dropout(G diag(row_scale) W), the same mask from the seed), and the weight
    gradient from the keep bits, against autograd in float64 on the reference mask."""
    from mgg.nn.dense import dropout_project

    torch.manual_seed(1)
    n, f, o, p, seed, row0 = 4099, 128, 16, 0.5, 987654321, 5
    x = torch.randn(n, f, device="cuda")
    w = torch.randn(o, f, device="cuda")
    g = torch.randn(n, o, device="cuda")
    rs = torch.rand(n, device="cuda") + 0.5 if scaled else None
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = dropout_project(xc, wc, p, seed, row0, row_scale=rs)
    out.backward(g)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    keep = hash_dropout_reference(torch.ones_like(x), p, seed, row0).double()  # 0 or 1 / (1 - p)
    ref = (xd * keep) @ wd.t()
    if scaled:
        ref = ref * rs.double().unsqueeze(1)
    ref.backward(g.double())
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(xc.grad.double(), xd.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wc.grad.double(), wd.grad, rtol=1e-4, atol=1e-2)
