"""mgg/kernels/tall_gemm.cu (3xTF32 tensor-core x @ B and G^T x of tall float32 matrices) against
float64, with B strided either way, bias and ReLU; then the mgg.nn.dense ops that take it (linear,
linear_relu, project: forward and backward), the switches that keep cuBLAS, and GIN trained a
step with and without it. Needs CUDA and cupy."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels import tall_gemm as tg  # noqa: E402
from mgg.nn import dense  # noqa: E402

#: relative error (Frobenius) allowed against float64; cuBLAS's float32 SIMT GEMM reads ~1e-7 here,
#: plain TF32 ~3e-4: 3xTF32 must be on float32's side
TOL = 2e-6


def rel(a, b):
    return float((a.double().cpu() - b).norm() / max(float(b.norm()), 1e-30))


def _poison(nbytes: int) -> None:
    """NaNs in the caching allocator's free blocks: an output element the kernel misses shows."""
    t = torch.full((nbytes // 4 + 4096,), float("nan"), device="cuda")
    del t


SHAPES = [(1, 4, 4), (31, 64, 64), (33, 16, 16), (1000, 60, 64), (100_003, 64, 64), (70_001, 64, 48),
          (5000, 48, 64), (3000, 4, 2), (2000, 36, 10), (4097, 12, 20), (64, 20, 62),
          # two passes over X's columns (K > 64)
          (100_003, 100, 64), (5000, 100, 48), (3001, 68, 10), (64, 128, 62), (33, 96, 2)]


@pytest.mark.parametrize("n,k,m", SHAPES)
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("bias,relu", [(False, False), (True, True), (True, False)])
def test_xb_matches_float64(n, k, m, transposed, bias, relu):
    gen = torch.Generator().manual_seed(n * 7 + k + m)
    x = torch.randn(n, k, generator=gen)
    w = torch.randn(m, k, generator=gen) / k ** 0.5
    b = torch.randn(m, generator=gen) if bias else None
    bmat = w.cuda().t() if transposed else w.t().contiguous().cuda()  # strided or contiguous [k, m]
    _poison(n * m * 4)
    out = tg.xb(x.cuda(), bmat, None if b is None else b.cuda(), relu)
    ref = x.double() @ w.double().t() + (0 if b is None else b.double())
    if relu:
        ref = torch.relu(ref)
    assert out.shape == (n, m) and not out.isnan().any()
    assert rel(out, ref) < TOL


def test_xb_empty_and_offset_input():
    w = torch.randn(8, 16, device="cuda")
    assert tg.xb(torch.zeros(0, 16, device="cuda"), w.t()).shape == (0, 8)
    big = torch.randn(1001 * 16 + 1, device="cuda")
    x = big[1:].view(1001, 16)  # 4-byte offset start: copied to an aligned one
    assert rel(tg.xb(x, w.t()), x.double().cpu() @ w.double().cpu().t()) < TOL


@pytest.mark.parametrize("n,m,k", [(1, 4, 4), (127, 64, 64), (129, 8, 12), (100_003, 64, 64), (250_000, 64, 64),
                                   (70_001, 48, 64), (5000, 64, 48), (3000, 32, 16), (2000, 36, 8), (0, 64, 64),
                                   (1000, 4, 64)])
def test_weight_grad_matches_float64(n, m, k):
    gen = torch.Generator().manual_seed(n + 3 * k + m)
    g = torch.randn(n, m, generator=gen)
    x = torch.randn(n, k, generator=gen)
    _poison(1 << 24)
    out = tg.weight_grad(g.cuda(), x.cuda())
    assert out.shape == (m, k) and not out.isnan().any()
    if n == 0:
        assert (out == 0).all()
        return
    ref = g.double().t() @ x.double()
    # a sum over n rows: float32 summation error, as cuBLAS's float32 GEMM has it
    cublas = rel(g.cuda().t() @ x.cuda(), ref)
    assert rel(out, ref) < max(TOL, 3 * cublas)
    assert torch.equal(out, tg.weight_grad(g.cuda(), x.cuda()))  # block sums in a fixed order


PROLOGUE_SHAPES = [(1, 4, 4), (33, 64, 64), (100_003, 64, 64), (5000, 12, 20), (70_001, 64, 48), (129, 60, 2)]


def _prologue(k: int, gen: torch.Generator):
    """A batch norm's map s x + o with some scales negative and offsets either side of 0."""
    return torch.randn(k, generator=gen), torch.randn(k, generator=gen)


@pytest.mark.parametrize("n,k,m", PROLOGUE_SHAPES)
@pytest.mark.parametrize("bias,relu", [(False, False), (True, True)])
def test_xb_prologue_matches_float64(n, k, m, bias, relu):
    """xb(x, b, prologue=(s, o)) == relu(s x + o) @ b (+ bias) (ReLU) in float64; rows past n
    and columns past K (where the map of a 0 would be relu(o)) add nothing."""
    gen = torch.Generator().manual_seed(11 * n + k + m)
    x = torch.randn(n, k, generator=gen)
    w = torch.randn(m, k, generator=gen) / k ** 0.5
    b = torch.randn(m, generator=gen) if bias else None
    s, o = _prologue(k, gen)
    _poison(n * m * 4)
    out = tg.xb(x.cuda(), w.cuda().t(), None if b is None else b.cuda(), relu, prologue=(s.cuda(), o.cuda()))
    z = torch.relu(x.double() * s.double() + o.double())
    ref = z @ w.double().t() + (0 if b is None else b.double())
    if relu:
        ref = torch.relu(ref)
    assert out.shape == (n, m) and not out.isnan().any()
    assert rel(out, ref) < TOL


@pytest.mark.parametrize("n,m,k", [(1, 4, 4), (127, 64, 64), (100_003, 64, 64), (5000, 64, 48), (3000, 32, 16),
                                   (2000, 36, 8)])
def test_weight_grad_prologue_matches_float64(n, m, k):
    """weight_grad(g, x, prologue=(s, o)) == g^T relu(s x + o); the last chunk's rows past n are
    0 in g, so relu(o) there adds nothing."""
    gen = torch.Generator().manual_seed(n + 5 * k + m)
    g = torch.randn(n, m, generator=gen)
    x = torch.randn(n, k, generator=gen)
    s, o = _prologue(k, gen)
    out = tg.weight_grad(g.cuda(), x.cuda(), prologue=(s.cuda(), o.cuda()))
    z = torch.relu(x.double() * s.double() + o.double())
    ref = g.double().t() @ z
    cublas = rel(g.cuda().t() @ z.float().cuda(), ref)
    assert out.shape == (m, k) and rel(out, ref) < max(TOL, 3 * cublas)


@pytest.mark.parametrize("n,m,k", [(1, 4, 4), (127, 64, 64), (100_003, 64, 64), (5000, 48, 64), (3000, 32, 16),
                                   (2000, 36, 8), (0, 64, 64)])
@pytest.mark.parametrize("prologue", [False, True])
def test_relu_weight_grad_matches_float64(n, m, k, prologue):
    """relu_weight_grad(g, y, x) == (g'^T x, g', column sums of g') with g' = g where y > 0: the
    masked gradient written in full (poisoned first), its sums, the GEMM on it (and on
    relu(s x + o) with the prologue)."""
    gen = torch.Generator().manual_seed(3 * n + k + m + prologue)
    g = torch.randn(n, m, generator=gen)
    y = torch.relu(torch.randn(n, m, generator=gen))  # a ReLU's output: about half zeros
    x = torch.randn(n, k, generator=gen)
    pro = _prologue(k, gen) if prologue else None
    _poison(1 << 24)
    gw, gm, gs = tg.relu_weight_grad(g.cuda(), y.cuda(), x.cuda(),
                                     None if pro is None else (pro[0].cuda(), pro[1].cuda()))
    gref = torch.where(y > 0, g, torch.zeros(()))
    assert gm.shape == (n, m) and torch.equal(gm.cpu(), gref)  # a copy or 0: exact
    assert gs.shape == (m,) and gw.shape == (m, k)
    if n == 0:
        assert (gw == 0).all() and (gs == 0).all()
        return
    z = x.double() if pro is None else torch.relu(x.double() * pro[0].double() + pro[1].double())
    ref = gref.double().t() @ z
    cublas = rel(gref.cuda().t() @ z.float().cuda(), ref)
    assert rel(gw, ref) < max(TOL, 3 * cublas)
    assert torch.allclose(gs.cpu().double(), gref.double().sum(0), rtol=1e-5, atol=1e-4)


def test_prologue_refuses_what_it_cannot_take():
    x = torch.zeros(10, 100, device="cuda")
    s = torch.ones(100, device="cuda")
    with pytest.raises(ValueError, match="prologue takes inner widths up to 64"):
        tg.xb(x, torch.zeros(100, 4, device="cuda"), prologue=(s, s))
    with pytest.raises(ValueError, match="prologue scale"):
        tg.xb(x[:, :64], torch.zeros(64, 4, device="cuda"), prologue=(s, s))
    with pytest.raises(ValueError, match="no column statistics"):
        tg.xb(x[:, :64], torch.zeros(64, 4, device="cuda"), stats_shift=s[:4], prologue=(s[:64], s[:64]))
    with pytest.raises(ValueError, match="multiples of 4 up to 64"):
        tg.weight_grad(torch.zeros(10, 4, device="cuda"), x, prologue=(s, s))


def test_tall_gemm_refuses_what_it_cannot_take():
    x = torch.zeros(10, 68, device="cuda")
    with pytest.raises(ValueError, match="multiple of 4 up to 128"):
        tg.xb(torch.zeros(10, 132, device="cuda"), torch.zeros(132, 4, device="cuda"))
    with pytest.raises(ValueError, match="even up to 64"):
        tg.xb(x[:, :64], torch.zeros(64, 47, device="cuda"))
    with pytest.raises(ValueError, match="float32 CUDA"):
        tg.xb(x.double(), torch.zeros(68, 4, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="multiple of 4 up to 128"):
        tg.xb(x[:, :66], torch.zeros(66, 4, device="cuda"))
    with pytest.raises(ValueError, match="bias"):
        tg.xb(x[:, :64], torch.zeros(64, 4, device="cuda"), torch.zeros(5, device="cuda"))
    with pytest.raises(ValueError, match="one row count"):
        tg.weight_grad(torch.zeros(10, 4, device="cuda"), torch.zeros(11, 4, device="cuda"))
    with pytest.raises(ValueError, match="multiples of 4"):
        tg.weight_grad(torch.zeros(10, 6, device="cuda"), torch.zeros(10, 4, device="cuda"))
    with pytest.raises(ValueError, match="multiples of 4 up to 64"):
        tg.weight_grad(torch.zeros(10, 64, device="cuda"), torch.zeros(10, 100, device="cuda"))


def _count_kernel(monkeypatch):
    used = []
    for name in ("xb", "weight_grad", "relu_weight_grad"):
        real = getattr(tg, name)
        monkeypatch.setattr(tg, name, lambda *a, _r=real, _n=name, **k: used.append(_n) or _r(*a, **k))
    return used


@pytest.mark.parametrize("op", ["linear", "linear_relu", "project"])
def test_dense_ops_take_the_kernel_and_match_float64(op, monkeypatch):
    used = _count_kernel(monkeypatch)
    n = dense.TALL_GEMM_ROWS + 123
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, 64, generator=gen)
    w = torch.randn(48, 64, generator=gen) / 8
    b = torch.randn(48, generator=gen)
    g = torch.randn(n, 48, generator=gen)
    xc, wc, bc = (t.cuda().requires_grad_() for t in (x, w, b))
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    if op == "linear":
        out, ref = dense.linear(xc, wc, bc), torch.nn.functional.linear(xr, wr, br)
    elif op == "linear_relu":
        out, ref = dense.linear_relu(xc, wc, bc), torch.nn.functional.linear(xr, wr, br)  # relu below
    else:
        out, ref = dense.project(xc, wc), xr @ wr.t()
    out.backward(g.cuda())
    if op == "linear_relu":
        # backward through the ReLU's mask as the kernel's output has it: an entry within rounding
        # of 0 may fall on either side, and one flipped entry would dwarf the GEMMs' errors
        ref.backward(torch.where(out.detach().cpu() > 0, g.double(), torch.zeros((), dtype=torch.float64)))
        ref = torch.relu(ref)
    else:
        ref.backward(g.double())
    assert rel(out.detach(), ref.detach()) < TOL
    assert rel(xc.grad, xr.grad) < TOL and rel(wc.grad, wr.grad) < TOL
    if op != "project":
        assert rel(bc.grad, br.grad) < 1e-5
    if op == "linear_relu":  # forward; the mask, grad b and grad W in one kernel; grad x
        assert used == ["xb", "relu_weight_grad", "xb"]
    else:
        assert used == ["xb", "xb", "weight_grad"]  # forward, grad x, grad W


def test_switches_keep_cublas(monkeypatch):
    used = _count_kernel(monkeypatch)
    x = torch.randn(dense.TALL_GEMM_ROWS, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")
    monkeypatch.setenv("MGG_TALL_GEMM", "0")
    dense.linear(x, w)
    monkeypatch.delenv("MGG_TALL_GEMM")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    dense.linear(x, w)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert used == []
    dense.linear(x[: dense.TALL_GEMM_ROWS - 1], w)  # too short: cuBLAS
    assert used == []
    dense.linear(x, w)
    assert used == ["xb"]


@pytest.mark.parametrize("norm", ["batch", "none"])
def test_gin_step_with_the_kernel_matches_cublas(norm, monkeypatch):
    """A GIN forward and backward on tall rows (the kernel's GEMMs) equals the same model on
    cuBLAS (MGG_TALL_GEMM=0) in float32 rounding."""
    from mgg.nn import GIN
    from mgg.testing.dense_gin import dense_gin_input

    monkeypatch.setattr(dense, "TALL_GEMM_ROWS", 64)  # the small test graph counts as tall
    used = _count_kernel(monkeypatch)
    x, graph = dense_gin_input(monkeypatch)
    outs = []
    for env in ("1", "0"):
        monkeypatch.setenv("MGG_TALL_GEMM", env)
        torch.manual_seed(0)
        model = GIN(int(x.shape[1]), 32, 5, layers=3, dropout=0.0, norm=norm).cuda()
        model.cache_input_aggregation = False
        out = model(x, graph)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
        if env == "1":
            assert "xb" in used and ("weight_grad" in used or "relu_weight_grad" in used)
            used.clear()
    assert used == []
    # float32 rounding, grown through three layers (batch norm divides by small deviations); a
    # bias right before a batch norm has a gradient of 0 up to rounding, so each gradient is
    # measured against the largest one
    assert rel(outs[0][0], outs[1][0].double().cpu()) < 1e-4
    scale = max(float(b.norm()) for b in outs[1][1])
    for a, b in zip(outs[0][1], outs[1][1]):
        assert float((a.double() - b.double()).norm()) < 1e-3 * max(float(b.norm()), 1e-2 * scale)


@pytest.mark.parametrize("n,k,m", [(1, 4, 4), (33, 64, 64), (100_003, 64, 64), (5000, 12, 20), (70_001, 64, 48),
                                   (70_001, 100, 64), (33, 128, 6)])
@pytest.mark.parametrize("shifted,bias,relu", [(False, False, False), (True, True, False), (True, False, True)])
def test_xb_column_statistics_match_float64(n, k, m, shifted, bias, relu):
    """The kernel's column mean and biased variance of its output (per-warp sums of (y - shift)
    and their squares, added in float64) against float64 over the output it wrote; the rows
    past n (the last tile's padding) count nothing."""
    gen = torch.Generator().manual_seed(n + k + m)
    x = torch.randn(n, k, generator=gen) + 3.0  # columns far from zero mean: a shift matters
    w = torch.randn(m, k, generator=gen) / k ** 0.5
    b = torch.randn(m, generator=gen).cuda() if bias else None
    shift = (torch.randn(m, generator=gen) if shifted else torch.zeros(m)).cuda()
    y, mean, var = tg.xb(x.cuda(), w.cuda().t(), b, relu, stats_shift=shift)
    yd = y.double().cpu()
    assert mean.dtype == var.dtype == torch.float64 and mean.shape == var.shape == (m,)
    assert torch.allclose(mean.cpu(), yd.mean(0), rtol=1e-6, atol=1e-6)
    # the sums are float32: var's error grows with (mean - shift)^2 (why the shift is a mean estimate)
    far = float(((yd.mean(0) - shift.double().cpu()) ** 2).max())
    assert torch.allclose(var.cpu(), yd.var(0, unbiased=False), rtol=1e-5, atol=1e-6 * (1 + far))
    assert torch.equal(y, tg.xb(x.cuda(), w.cuda().t(), b, relu))  # the same output as without


def test_batch_norm_with_local_statistics_equals_its_own(monkeypatch):
    """DistBatchNorm given this rank's statistics (as linear_with_stats hands them over) computes
    what it computes from a pass of its own: forward, backward and running statistics."""
    from mgg.nn.norm import DistBatchNorm

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(20_000, 64, generator=gen) * 2 + 1).cuda()
    g = torch.randn(20_000, 64, generator=gen).cuda()
    outs = []
    for given in (False, True):
        torch.manual_seed(0)
        bn = DistBatchNorm(64).cuda()
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
        xi = x.clone().requires_grad_()
        xd = x.double()
        st = (xd.mean(0), xd.var(0, unbiased=False)) if given else None
        out = bn(xi, None, relu=True, local_stats=st)
        out.backward(g)
        outs.append((out.detach(), xi.grad, bn.weight.grad, bn.running_mean.clone(), bn.running_var.clone()))
    for a, b in zip(*outs):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gin_batch_norm_reads_the_gemm_statistics(monkeypatch):
    """GIN with batch norm on tall rows (3 layers: norms of width 32 in the two hidden MLPs and
    after the two hidden convolutions, and the last MLP's, 5 classes wide, which runs
    F.batch_norm): each MLP's first Linear sums its columns in the tall-GEMM kernel, so its norm
    runs no torch.batch_norm_stats; the norm after a convolution reads rows the norm-linear GEMM
    wrote (the MLP's norm, ReLU and second Linear in one kernel, which sums no columns) and does
    (2 calls). With MGG_TALL_GEMM=0 all four norms of width 32 do."""
    from mgg.nn import GIN
    from mgg.testing.dense_gin import dense_gin_input

    monkeypatch.setattr(dense, "TALL_GEMM_ROWS", 64)
    calls = []
    real = torch.batch_norm_stats
    monkeypatch.setattr(torch, "batch_norm_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, graph = dense_gin_input(monkeypatch)
    for env, want in (("1", 2), ("0", 4)):
        monkeypatch.setenv("MGG_TALL_GEMM", env)
        calls.clear()
        model = GIN(int(x.shape[1]), 32, 5, layers=3, dropout=0.0, norm="batch").cuda()
        model.cache_input_aggregation = False
        model(x, graph).sum().backward()
        assert len(calls) == want


def test_gin_asks_for_statistics_only_where_the_norm_uses_them(monkeypatch):
    """The Linear before a batch norm sums its columns (linear_with_stats) only when the norm
    will take them (DistBatchNorm.uses_local_stats): training on the fused GPU path; not with
    fuse_relu off at one rank without rows (F.batch_norm computes its own), nor in eval."""
    from mgg.nn import GIN
    from mgg.nn.conv import gin_conv
    from mgg.nn.norm import DistBatchNorm
    from mgg.testing.dense_gin import dense_gin_input

    monkeypatch.setattr(dense, "TALL_GEMM_ROWS", 64)
    asked = []
    real = gin_conv.linear_with_stats
    monkeypatch.setattr(gin_conv, "linear_with_stats", lambda *a, **k: asked.append(1) or real(*a, **k))
    x, graph = dense_gin_input(monkeypatch)
    model = GIN(int(x.shape[1]), 32, 5, layers=3, dropout=0.0, norm="batch").cuda()
    model.cache_input_aggregation = False
    # fused training: the first Linear of each hidden MLP, before its norm of width 32 (the norm
    # after the convolution reads the norm-linear GEMM's rows; the 5-wide norm runs F.batch_norm)
    for fuse, train, want in ((True, True, 2), (False, True, 0), (True, False, 0)):
        for mod in model.modules():
            if isinstance(mod, DistBatchNorm):
                mod.fuse_relu = fuse
        model.train(train)
        asked.clear()
        model(x, graph)
        assert len(asked) == want, (fuse, train)
