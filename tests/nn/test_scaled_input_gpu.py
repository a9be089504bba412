"""The gcn column factor folded into the producing op, on one GPU: csr_rows' native path
(DistGraph.aggregate(factors=SCALED_INPUT / GcnFactors(row=False)) skip the pre-scale pass and
the row factor),
the dropout kernel's row_scale, and GCN training with the fold against the same model without
it. References: dense float64 math, and the unfolded model (same seeds)."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.dropout_gpu import dropout_hash_cuda  # noqa: E402
from mgg.kernels.csr_rows import CsrRowsExecutor  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import SCALED_INPUT, DistGraph, GcnFactors, RuntimeConfig  # noqa: E402
from mgg.testing.reference import aggregation_matrix  # noqa: E402
from mgg.testing.graphs import power_law_csr  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


def _one_rank():
    comm = world()
    if comm.size != 1:
        pytest.skip("csr_rows alone at P = 1 (over ranks: tests/kernels/test_halo_csr_gpu.py; the fallback: "
                    "tests/nn/test_scaled_input.py)")
    return comm


@pytest.mark.parametrize("dim", [1, 16, 33, 64])
def test_native_scaled_input_and_row_factor_match_dense(dim):
    comm = _one_rank()
    indptr, indices = power_law_csr(2500, seed=7, hubs=4, hub_deg=3000)
    d = 1.0 / np.sqrt(np.diff(indptr).astype(np.float64) + 1.0)
    w = aggregation_matrix(indptr, indices, "gcn")  # W + diag, float64 sparse
    a_hat_t = (w.multiply(1.0 / d[:, None]).multiply(1.0 / d[None, :])).T.tocsr()  # (A + I)^T
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu")) as dg:
        assert dg.takes_scaled_input("gcn") and not dg.takes_scaled_input("sum_self")
        for t in (False, True):
            ex = dg.executor("gcn", t)
            assert isinstance(ex, CsrRowsExecutor) and ex.takes_scaled_input
            ex.poison = True  # NaN outputs and partials: an unwritten element fails
        calls = []
        ex = dg.executor("gcn", False)
        real = ex._scale_rows
        ex._scale_rows = lambda *a: calls.append(1) or real(*a)
        rng = np.random.default_rng(dim)
        x = rng.standard_normal((2500, dim))
        f = dg.gcn_factor()
        xs = (f.unsqueeze(1) * torch.from_numpy(x).float().to(DEV)).contiguous()
        out = dg.aggregate(xs, "gcn", factors=SCALED_INPUT).double().cpu().numpy()
        assert not calls  # no pre-scale pass
        ref = w @ x
        assert np.linalg.norm(out - ref) <= 1e-6 * np.linalg.norm(ref)
        g = rng.standard_normal((2500, dim))
        out = dg.aggregate(torch.from_numpy(g).float().to(DEV), "gcn", transposed=True,
                           factors=GcnFactors(row=False)).double().cpu().numpy()
        ref = a_hat_t @ (d[:, None] * g)
        assert np.linalg.norm(out - ref) <= 1e-6 * np.linalg.norm(ref)
        # the plain call still scales once and agrees
        plain = dg.aggregate(torch.from_numpy(x).float().to(DEV), "gcn").double().cpu().numpy()
        assert calls == [1] and np.linalg.norm(plain - w @ x) <= 1e-6 * np.linalg.norm(w @ x)


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """float64 of t (float32) rounded to `dtype` once."""
    return t.to(dtype).double().cpu().numpy()


@pytest.mark.parametrize("storage", ["bf16"])
@pytest.mark.parametrize("dim", [1, 16, 24, 64])
def test_native_scaled_input_16_bit_rounds_the_scaled_rows_once(storage, dim):
    """bf16 storage takes scaled input natively: the table is the scaled rows rounded once
    (SCALED_INPUT: x as given; GcnFactors(row=False): f * x), the kernels run w = 1 (no per-edge
    weight stream), and the sums match float64 math on those rounded rows."""
    import mgg.kernels.csr_rows.executor as lc  # the module whose launchers the executor calls

    comm = _one_rank()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[storage]
    n = 2500
    indptr, indices = power_law_csr(n, seed=11, hubs=4, hub_deg=3000)
    d = 1.0 / np.sqrt(np.diff(indptr).astype(np.float64) + 1.0)
    w = aggregation_matrix(indptr, indices, "gcn")
    a_hat = w.multiply(1.0 / d[:, None]).multiply(1.0 / d[None, :]).tocsr()  # A + I
    modes = []
    real_scan, real_rows = lc.launch_csr_scan, lc.launch_csr_rows
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu", storage_dtype=storage)) as dg:
        assert dg.takes_scaled_input("gcn") and not dg.takes_scaled_input("sum_self")
        for t in (False, True):
            ex = dg.executor("gcn", t)
            assert isinstance(ex, CsrRowsExecutor) and ex.takes_scaled_input and ex.storage_dtype == dt
            ex.poison = True
        f = dg.gcn_factor()
        rng = np.random.default_rng(dim)
        xs = (f.unsqueeze(1) * torch.from_numpy(rng.standard_normal((n, dim))).float().to(DEV)).contiguous()
        g = torch.from_numpy(rng.standard_normal((n, dim))).float().to(DEV)
        try:
            lc.launch_csr_scan = lambda *a, **k: (modes.append(a[2]), real_scan(*a, **k))[1]
            lc.launch_csr_rows = lambda *a, **k: (modes.append(a[4]), real_rows(*a, **k))[1]
            out = dg.aggregate(xs, "gcn", factors=SCALED_INPUT).double().cpu().numpy()
            back = dg.aggregate(g, "gcn", transposed=True, factors=GcnFactors(row=False)).double().cpu().numpy()
        finally:
            lc.launch_csr_scan, lc.launch_csr_rows = real_scan, real_rows
        assert modes and set(modes) == {lc.WEIGHT_MODES["one"]}  # w = 1: no weight stream
        ref = d[:, None] * (a_hat @ _rounded(xs, dt))
        assert np.linalg.norm(out - ref) <= 1e-5 * np.linalg.norm(ref)
        ref = a_hat.T @ _rounded(torch.mul(g, f.unsqueeze(1)), dt)
        assert np.linalg.norm(back - ref) <= 1e-5 * np.linalg.norm(ref)
        # a plain call still rounds x itself and reads the per-edge weights
        x = xs / f.unsqueeze(1)
        plain = dg.aggregate(x, "gcn").double().cpu().numpy()
        ref = w @ _rounded(x, dt)
        assert np.linalg.norm(plain - ref) <= 1e-5 * np.linalg.norm(ref)


def test_csr_rows_refuses_scaled_input_where_it_cannot_take_it():
    comm = _one_rank()
    indptr, indices = power_law_csr(300, seed=2)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu")) as dg:
        ex = CsrRowsExecutor(dg.plan("sum_self"), None, "sum_self")
        with pytest.raises(ValueError, match="takes no scaled input"):
            ex(torch.randn(300, 8, device=DEV), scaled_input=True)
        bf = CsrRowsExecutor(dg.plan("sum_self"), None, "sum_self", storage_dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="takes no scaled input"):
            bf(torch.randn(300, 8, device=DEV), row_factor=False)
        assert CsrRowsExecutor(dg.plan("gcn"), None, "gcn", storage_dtype=torch.bfloat16).takes_scaled_input
        fp16 = CsrRowsExecutor(dg.plan("gcn"), None, "gcn", storage_dtype=torch.float16)
        assert not fp16.takes_scaled_input  # f * grad would leave fp16's range (SCALED_INPUT_STORAGE)
        with pytest.raises(ValueError, match="takes no scaled input"):
            fp16(torch.randn(300, 8, device=DEV), scaled_input=True)
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu", storage_dtype="fp16")) as dg:
        assert not dg.takes_scaled_input("gcn")


@pytest.mark.parametrize("n,d", [(1000, 16), (37, 3), (513, 64)])
def test_dropout_row_scale_is_the_dropout_times_the_scale(n, d):
    x = torch.randn(n, d, device=DEV) + 0.5
    s = torch.rand(n, device=DEV) + 0.5
    out = dropout_hash_cuda(x, 0.5, 2 ** 45 + 7, 11, s)
    assert torch.equal(out, dropout_hash_cuda(x, 0.5, 2 ** 45 + 7, 11) * s.unsqueeze(1))
    with pytest.raises(TypeError, match="row_scale"):
        dropout_hash_cuda(x, 0.5, 1, 0, s.double())


def test_dropout_project_row_scale_scales_the_output_and_the_weight_gradient():
    from mgg.kernels.dropout_project import project_forward, project_weight_grad

    x = torch.randn(5000, 40, device=DEV)
    w = torch.randn(24, 40, device=DEV)
    s = torch.rand(5000, device=DEV) + 0.5
    out, mask = project_forward(x, w, 0.5, 77, 3, keep_mask=True, row_scale=s)
    ref, ref_mask = project_forward(x, w, 0.5, 77, 3, keep_mask=True)
    assert torch.equal(mask, ref_mask)
    torch.testing.assert_close(out, ref * s.unsqueeze(1), rtol=1e-6, atol=1e-6)
    g = torch.randn(5000, 24, device=DEV)
    gw = project_weight_grad(x, g, 0.5, 77, 3, mask=mask, row_scale=s)
    torch.testing.assert_close(gw, project_weight_grad(x, g * s.unsqueeze(1), 0.5, 77, 3, mask=mask),
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(TypeError, match="row_scale"):
        project_forward(x, w, 0.5, 77, 3, row_scale=s[:-1])


def _fold_runs(monkeypatch, storage: str, probe) -> list:
    """A 3-layer GCN (dropout 0.5) trained 3 Adam steps with the gcn factor's fold off, then on
    (DistGraph.takes_scaled_input patched to say no, then what it says), same seeds. `probe(stage)`
    is called with "step" before each step, "forward" after its forward, and "fold" after the
    last step. Returns per fold (losses, parameters, probe("fold"))."""
    from mgg.nn import build_model
    from mgg.nn.optim import Adam

    comm = _one_rank()
    state = {"fold": False}
    real_takes = DistGraph.takes_scaled_input
    monkeypatch.setattr(DistGraph, "takes_scaled_input",
                        lambda self, kind, rows=None: state["fold"] and real_takes(self, kind, rows))
    indptr, indices = power_law_csr(3000, seed=5, hubs=3, hub_deg=2000)
    runs = []
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="gpu", storage_dtype=storage)) as dg:
        torch.manual_seed(1)
        x = torch.randn(3000, 40, device=DEV)
        y = torch.randint(0, 5, (3000,), device=DEV)
        for fold in (False, True):
            state["fold"] = fold
            torch.manual_seed(2)
            m = build_model("gcn", 40, 24, 5, 3, 0.5).cuda()
            opt = Adam(m.parameters(), lr=0.01)
            gen = torch.Generator().manual_seed(9)
            losses = []
            for _ in range(3):
                opt.zero_grad()
                probe("step")
                out = m(x, dg, gen)
                probe("forward")
                loss = torch.nn.functional.cross_entropy(out, y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            runs.append((losses, [p.detach().clone() for p in m.parameters()], probe("fold")))
    return runs


@pytest.mark.parametrize("fused_input", [False, True])
def test_gcn_training_with_the_fold_matches_the_plain_model(monkeypatch, fused_input):
    """GCN (3 layers) trained 3 Adam steps with the gcn factor folded into the dropout before
    each conv (the default at P = 1; with `fused_input` the first layer's dropout_project
    kernels take it) and with the fold off: same losses and weights within float32 rounding;
    the folded forward runs no pre-scale pass."""
    from mgg.nn import dense

    if fused_input:
        monkeypatch.setattr(dense, "TALL_ROWS", 0)
    passes, seen = [], {}
    real_scale = CsrRowsExecutor._scale_rows
    monkeypatch.setattr(CsrRowsExecutor, "_scale_rows", lambda self, *a: (passes.append(1), real_scale(self, *a))[1])

    def probe(stage):
        if stage == "step":
            passes.clear()
        elif stage == "forward":
            seen["forward"] = len(passes)
        return seen.get("forward")

    (l0, w0, p0), (l1, w1, p1) = _fold_runs(monkeypatch, "fp32", probe)
    assert (p0, p1) == (3, 0)  # one pre-scale pass per conv without the fold, none with it
    assert l1 == pytest.approx(l0, rel=1e-5)
    for a, b in zip(w1, w0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gcn_training_with_the_fold_in_bf16_storage_reads_no_edge_weights(monkeypatch):
    """bf16 storage: GCN (3 layers) trained 3 Adam steps with the fold (the dropout writes f * x,
    the aggregation rounds that once and runs w = 1 both ways) and without it (per-edge
    weights on x rounded): losses agree to bf16 rounding; with the fold every launch runs w = 1
    (none reads the per-edge weight stream, none takes DistGraph's unscaling fallback)."""
    import mgg.kernels.csr_rows.executor as lc  # the module whose launchers the executor calls

    modes = []
    real_scan, real_rows = lc.launch_csr_scan, lc.launch_csr_rows
    monkeypatch.setattr(lc, "launch_csr_scan", lambda *a, **k: (modes.append(a[2]), real_scan(*a, **k))[1])
    monkeypatch.setattr(lc, "launch_csr_rows", lambda *a, **k: (modes.append(a[4]), real_rows(*a, **k))[1])

    def probe(stage):
        if stage == "fold":
            got = set(modes)
            modes.clear()
            return got

    (l0, _, m0), (l1, _, m1) = _fold_runs(monkeypatch, "bf16", probe)
    assert m0 == {lc.WEIGHT_MODES["weighted"]} and m1 == {lc.WEIGHT_MODES["one"]}
    assert l1 == pytest.approx(l0, rel=2e-2)
