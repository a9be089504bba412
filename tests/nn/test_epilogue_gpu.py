"""The fused epilogue of a hidden GCN layer on one GPU (mgg/kernels/bias_relu_dropout.cu,
mgg.nn.epilogue): the kernels against the unfused chain they replace (torch's add and ReLU, the
dropout kernel; autograd for the backward) bit for bit, the bias gradient against float64 sums,
and GCN training with the epilogue against the same model without it: same logits, no pre-scale
pass left in the backward."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.bias_relu_dropout import brd_backward, brd_forward  # noqa: E402
from mgg.kernels.csr_rows import CsrRowsExecutor  # noqa: E402
from mgg.nn.functional import DeviceSeeds, HashDropoutCUDA, mix_seed  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import SCALED_INPUT, WHOLE, DistGraph, RuntimeConfig  # noqa: E402
from mgg.testing.graphs import power_law_csr  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


def _inputs(n: int, d: int, seed: int = 0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randn(n, d, device=DEV, generator=g)
    a[::7, 0] = 0.0  # exact zeros (and values the bias takes to zero or below)
    if n > 3:
        a[3, :] = float("nan")  # the ReLU passes a NaN on, and its gradient (torch's)
    bias = torch.randn(d, device=DEV, generator=g)
    rs = torch.rand(n, device=DEV, generator=g) + 0.5
    return a, bias, rs


def _chain(a, bias, p, seed, row0, rs):
    """The unfused forward: torch's add and ReLU, then the dropout kernel (or the row scale)."""
    y = torch.relu(a if bias is None else a + bias)
    if p > 0:
        return HashDropoutCUDA.apply(y, p, seed, row0, rs)
    return y if rs is None else y * rs.unsqueeze(1)


def _same(x: torch.Tensor, y: torch.Tensor) -> None:
    torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("n,d", [(1000, 16), (37, 4), (513, 64), (300, 1024), (0, 8)])
@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("with_bias,with_scale", [(True, True), (False, False), (True, False)])
def test_forward_and_backward_are_the_unfused_chain(n, d, p, with_bias, with_scale):
    a, bias, rs = _inputs(n, d, seed=n + d)
    bias = bias if with_bias else None
    rs = rs if with_scale else None
    seed, row0 = 2 ** 45 + 11, 5
    _same(brd_forward(a, bias, p, seed, row0, rs), _chain(a, bias, p, seed, row0, rs))
    # backward: autograd through the chain gives d loss / d (a + b); the kernel gives the same
    # bits, its column sums (the bias gradient) and, with out_scale, those bits times f per row
    a_ref = a.clone().requires_grad_(True)
    g = torch.randn(n, d, device=DEV)
    _chain(a_ref, bias, p, seed, row0, rs).backward(g)
    gout, db = brd_backward(g, a, bias, p, seed, row0, rs)
    _same(gout, a_ref.grad)
    ref_db = a_ref.grad.double().nan_to_num().sum(0)
    torch.testing.assert_close(db.double(), ref_db, rtol=1e-5, atol=1e-4)
    f = torch.rand(n, device=DEV) + 0.5
    scaled, db2 = brd_backward(g, a, bias, p, seed, row0, rs, f)
    _same(scaled, a_ref.grad * f.unsqueeze(1))
    _same(db2, db)


def test_device_seed_is_the_mixed_counter():
    a, bias, rs = _inputs(700, 32)
    seeds = DeviceSeeds(torch.Generator().manual_seed(3), DEV)
    s = seeds.draw()
    host = mix_seed(int(s.item()))
    _same(brd_forward(a, bias, 0.4, s, 9, rs), brd_forward(a, bias, 0.4, host, 9, rs))
    g = torch.randn_like(a)
    _same(brd_backward(g, a, bias, 0.4, s, 9, rs)[0], brd_backward(g, a, bias, 0.4, host, 9, rs)[0])


def test_bad_input_names_the_problem():
    a, bias, rs = _inputs(64, 16)
    with pytest.raises(ValueError, match="D = 4"):
        brd_forward(torch.randn(64, 6, device=DEV), None, 0.5, 1, 0)
    with pytest.raises(ValueError, match="bias must be float32 \\[16\\]"):
        brd_forward(a, bias[:8], 0.5, 1, 0)
    with pytest.raises(ValueError, match="row_scale must be float32 \\[64\\]"):
        brd_forward(a, bias, 0.5, 1, 0, rs.double())
    with pytest.raises(ValueError, match="p must be in"):
        brd_forward(a, bias, 1.0, 1, 0)
    with pytest.raises(ValueError, match="must match"):
        brd_backward(torch.randn(63, 16, device=DEV), a, bias, 0.5, 1, 0)
    with pytest.raises(ValueError, match="out_scale must be float32 \\[64\\]"):
        brd_backward(torch.randn_like(a), a, bias, 0.5, 1, 0, rs, rs[:10])


def _one_rank():
    comm = world()
    if comm.size != 1:
        pytest.skip("one rank (the fold of the backward's factor is the P = 1 path)")
    return comm


def _train(dg, x, y, fuse: bool, hidden: int, layers: int = 3, steps: int = 3, model: str = "gcn"):
    from mgg.nn import build_model
    from mgg.nn.optim import Adam

    torch.manual_seed(2)
    m = build_model(model, x.shape[1], hidden, 5, layers, 0.5).cuda()
    m.fuse_epilogue = fuse
    opt = Adam(m.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(9)
    losses, first = [], None
    for _ in range(steps):
        opt.zero_grad()
        out = m(x, dg, gen)
        first = out.detach().clone() if first is None else first
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return first, losses, [p.detach().clone() for p in m.parameters()]


@pytest.mark.parametrize("hidden", [16, 24])
def test_gcn_training_with_the_epilogue_matches_the_layer_by_layer_model(monkeypatch, hidden):
    """3-layer GCN, dropout 0.5, 3 Adam steps, with and without the epilogue: the first forward's
    logits are the same bits; losses and weights agree to float32 rounding (the bias gradient is
    summed in another order). Hidden 16 fuses (and folds the backward's factor: no pre-scale pass
    at all in a step); hidden 24 (no power of two) takes the unfused chain."""
    comm = _one_rank()
    passes = []
    real_scale = CsrRowsExecutor._scale_rows
    monkeypatch.setattr(CsrRowsExecutor, "_scale_rows", lambda self, *a: (passes.append(1), real_scale(self, *a))[1])
    indptr, indices = power_law_csr(3000, seed=5, hubs=3, hub_deg=2000)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu")) as dg:
        assert dg.takes_scaled_input("gcn")
        for t in (False, True):
            dg.executor("gcn", t).poison = True
        torch.manual_seed(1)
        x = torch.randn(3000, 40, device=DEV)
        y = torch.randint(0, 5, (3000,), device=DEV)
        runs = {}
        for fuse in (False, True):
            passes.clear()
            runs[fuse] = _train(dg, x, y, fuse, hidden)
            runs[fuse] += (len(passes),)
    (o0, l0, w0, p0), (o1, l1, w1, p1) = runs[False], runs[True]
    _same(o1, o0)
    assert l1 == pytest.approx(l0, rel=1e-5)
    for a, b in zip(w1, w0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # layer by layer, every conv's backward aggregation pre-scales its gradient (3 a step); with
    # the epilogue at a fused width only the last conv's does (its gradient comes from the loss)
    assert p0 == 3 * 3
    assert p1 == (3 * 1 if hidden == 16 else 3 * 3)


def test_eval_forward_fuses_bias_and_relu(monkeypatch):
    """Eval (no dropout): the epilogue is the bias, the ReLU and the next conv's input scale (its
    aggregation then runs no pre-scale pass: one in the forward, the first conv's); against
    float64 dense math."""
    from mgg.nn import build_model
    from mgg.testing.reference import aggregation_matrix

    comm = _one_rank()
    passes = []
    real_scale = CsrRowsExecutor._scale_rows
    monkeypatch.setattr(CsrRowsExecutor, "_scale_rows", lambda self, *a: (passes.append(1), real_scale(self, *a))[1])
    indptr, indices = power_law_csr(2000, seed=3, hubs=2, hub_deg=800)
    w_hat = aggregation_matrix(indptr, indices, "gcn").toarray()
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu")) as dg:
        torch.manual_seed(4)
        m = build_model("gcn", 32, 16, 4, 2, 0.5).cuda().eval()
        m.cache_input_aggregation = False
        x = torch.randn(2000, 32, device=DEV)
        with torch.no_grad():
            out = m(x, dg).double().cpu().numpy()
        assert passes == [1]
        c1, c2 = m.convs
        w1, b1 = c1.lin.weight.detach().double().cpu().numpy(), c1.bias.detach().double().cpu().numpy()
        w2, b2 = c2.lin.weight.detach().double().cpu().numpy(), c2.bias.detach().double().cpu().numpy()
        h = np.maximum(w_hat @ (x.double().cpu().numpy() @ w1.T) + b1, 0.0)
        ref = w_hat @ h @ w2.T + b2
        assert np.linalg.norm(out - ref) <= 1e-5 * np.linalg.norm(ref)


@pytest.mark.parametrize("scaled", [False, True])
def test_compact_rows_backward_scales_only_the_rows_of_the_set(monkeypatch, scaled):
    """aggregate(x, "gcn", rows=S) returning S's rows (a last layer's loss rows): AggregateRows'
    backward scatters f * g into the full table and runs the transposed call on it as a scaled
    input. Its gradient is Aggregate's bit for bit, and no pre-scale pass runs."""
    from mgg.nn.functional import Aggregate, AggregateRows, aggregate

    comm = _one_rank()
    indptr, indices = power_law_csr(2500, seed=8, hubs=3, hub_deg=1500)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu")) as dg:
        rs = dg.register_rows("loss", np.arange(0, 2500, 7))
        assert dg.takes_scaled_input("gcn", rs)
        used, passes = [], []
        real_rows, real_scale = AggregateRows.apply, CsrRowsExecutor._scale_rows
        monkeypatch.setattr(AggregateRows, "apply", lambda *a: (used.append(1), real_rows(*a))[1])
        monkeypatch.setattr(CsrRowsExecutor, "_scale_rows", lambda self, *a: (passes.append(1), real_scale(self, *a))[1])
        x = torch.randn(2500, 16, device=DEV)
        g = torch.randn(len(rs), 16, device=DEV)
        xa = x.clone().requires_grad_(True)
        factors = SCALED_INPUT if scaled else WHOLE
        out = aggregate(xa, dg, "gcn", rs, factors=factors)
        passes.clear()  # (a forward on an unscaled x scales it: not what this test is about)
        out.backward(g)
        assert used == [1] and passes == []
        xb = x.clone().requires_grad_(True)
        ref = Aggregate.apply(xb, dg, "gcn", rs, factors)[rs.index]
        passes.clear()
        ref.backward(g)
        _same(out, ref)
        _same(xa.grad, xb.grad)
        assert passes == [1]  # Aggregate's backward pre-scales the full table


@pytest.mark.parametrize("p,with_scale", [(0.0, False), (0.0, True), (0.5, True)])
def test_apply_epilogue_fused_is_the_reference_chain(p, with_scale):
    """apply_epilogue (the kernels, no aggregation before them: GCNConv.forward_aggregated and the
    aggregate-first order) against epilogue_reference (torch ops and the dropout kernel): the
    output and the input's gradient bit for bit, the bias gradient to float32 rounding."""
    from mgg.nn.epilogue import BiasReluDropout, Epilogue, apply_epilogue, epilogue_reference

    a, bias, rs = _inputs(1500, 32, seed=5)
    a[3] = 0.5  # no NaN here: a NaN row would make the bias gradients NaN alike
    epi = Epilogue(p, 2 ** 50 + 1 if p else None, 12, rs if with_scale else None)
    used = []
    real = BiasReluDropout.apply
    BiasReluDropout.apply = lambda *x: (used.append(1), real(*x))[1]
    try:
        grads = []
        for fn in (apply_epilogue, epilogue_reference):
            h = a.clone().requires_grad_(True)
            b = bias.clone().requires_grad_(True)
            out = fn(h, b, epi)
            out.backward(torch.ones_like(out) * 0.25 + h.detach().abs())
            grads.append((out.detach(), h.grad, b.grad))
    finally:
        BiasReluDropout.apply = real
    assert used == [1]
    (o1, h1, b1), (o2, h2, b2) = grads
    _same(o1, o2)
    _same(h1, h2)
    torch.testing.assert_close(b1, b2, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("hidden", [16, 64])  # 16 < in 40: projected before the mean; 64: after
def test_sage_training_with_the_epilogue_matches_the_layer_by_layer_model(monkeypatch, hidden):
    """3-layer SAGE, dropout 0.5, 3 Adam steps, with and without the epilogue (the root term by
    addmm, then one fused pass each way): logits, losses and weights agree to float32 rounding,
    and the fused kernels ran for both hidden layers of every step."""
    import mgg.kernels.bias_relu_dropout as brd

    calls = []
    real_fwd, real_bwd = brd.brd_forward, brd.brd_backward
    monkeypatch.setattr(brd, "brd_forward", lambda *a, **k: (calls.append("f"), real_fwd(*a, **k))[1])
    monkeypatch.setattr(brd, "brd_backward", lambda *a, **k: (calls.append("b"), real_bwd(*a, **k))[1])
    indptr, indices = power_law_csr(3000, seed=6, hubs=3, hub_deg=2000)
    with DistGraph(indptr, indices, world(), RuntimeConfig(backend="gpu")) as dg:
        torch.manual_seed(1)
        x = torch.randn(dg.n_local, 40, device=DEV)
        y = torch.randint(0, 5, (dg.n_local,), device=DEV)
        runs = {}
        for fuse in (False, True):
            calls.clear()
            runs[fuse] = _train(dg, x, y, fuse, hidden, model="sage") + (list(calls),)
    (o0, l0, w0, c0), (o1, l1, w1, c1) = runs[False], runs[True]
    assert c0 == [] and c1.count("f") == 2 * 3 and c1.count("b") == 2 * 3
    torch.testing.assert_close(o1, o0, rtol=1e-5, atol=1e-5)
    assert l1 == pytest.approx(l0, rel=1e-5)
    for a, b in zip(w1, w0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

