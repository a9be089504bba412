"""CsrRowsExecutor (mgg/kernels/local_csr.cu) against the float64 reference on one GPU.

Power-law graphs with isolated rows and hub rows (degree >> 32, split over several warps with
small chunks), every width class, sum / mean / gcn, forward and transposed plans, each weight
mode (the factored ones and the per-edge fallback). Outputs and partial buffers are NaN-poisoned
before every launch, so an unwritten element fails. Needs CUDA and cupy, not NVSHMEM:

    python -m pytest -q -p no:cacheprovider tests/kernels/test_local_csr_gpu.py
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.kernels.csr_rows import (BUNDLE_LANES, SCAN_DEFAULT_LANES, SCAN_LANES, CsrRowsExecutor,  # noqa: E402
                                 bundles_pay, default_long_threshold, entries_per_batch, lanes_for_width)
from mgg.testing.reference import aggregate_reference  # noqa: E402
from mgg.testing.dist_graphs import cpu_plans  # noqa: E402
from mgg.testing.graphs import hub_graph  # noqa: E402
from mgg.testing.tensors import rel_err  # noqa: E402

DIMS = (1, 3, 4, 8, 16, 20, 32, 33, 64, 128, 512)
#: (long_threshold, chunk): defaults; every non-empty row a warp task cut in chunks of 64;
#: hubs (degree >= 700) split at 500
SCHEDULES = ((None, 2048), (0, 64), (None, 500))


def run(ex, x, times=2):
    ex.poison = True
    xt = torch.from_numpy(x).cuda()
    outs = [ex(xt).cpu().numpy() for _ in range(times)]  # buffers and schedules reused
    return outs


#: (row_mapping, bundle_batches, scan_run): the per-layout default; one row per group; bundles
#: (default size; one batch each, so most bundles end inside a batch and hold several rows); scan
#: runs (default size; runs of about 7 entries, so that most windows hold several runs' worth of
#: row ends and a run's rows end anywhere in a window)
MAPPINGS = (("default", 8, 1024), ("packed", 8, 1024), ("bundles", 8, 1024), ("bundles", 1, 1024),
            ("scan", 8, 1024), ("scan", 8, 7))


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
def test_matches_reference(kind, dim, sched, mapping):
    indptr, indices = hub_graph()
    x = np.random.default_rng(dim).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    for transposed, plan in cpu_plans(indptr, indices, kind).items():
        ex = CsrRowsExecutor(plan, None, kind, long_threshold=sched[0], chunk=sched[1], row_mapping=mapping[0],
                             bundle_batches=mapping[1], scan_run=mapping[2])
        assert ex.factors.mode != "weighted", ex.factors.note
        if kind == "gcn":  # w = dinv[row] dinv[col]: the table is scaled once, the kernel runs w = 1
            assert ex.factors.mode == "column" and ex.can_prescale
        if sched[1] < 1000 and not transposed:  # the forward hubs (degree >= 3000) are split
            groups = 32 // lanes_for_width(-(-dim // 4) * 4)[0]
            assert len(ex.schedule(groups).split) >= 4
        lanes, vpl = lanes_for_width(-(-dim // 4) * 4)
        pays = bundles_pay(plan.local_indptr, default_long_threshold(32 // lanes) if sched[0] is None else sched[0],
                           mapping[1] * entries_per_batch(lanes))
        scan = vpl == 1 and lanes in SCAN_LANES and (
            mapping[0] == "scan" or (mapping[0] == "default" and lanes in SCAN_DEFAULT_LANES and pays))
        assert ex.uses_scan(lanes, vpl) == scan
        wanted = mapping[0] == "bundles" or (mapping[0] in ("default", "scan") and lanes in BUNDLE_LANES and pays)
        assert ex.uses_bundles(lanes, vpl) == (wanted and vpl == 1 and not scan)
        ref = aggregate_reference(indptr, indices, x, kind, transposed)
        # column mode (gcn; mean transposed): both the scaled table and cf[src] read per edge
        for prescale in ((True, False) if ex.can_prescale else (ex.prescale,)):
            ex.prescale = prescale
            for out in run(ex, x):
                assert out.shape == (len(indptr) - 1, dim) and out.dtype == np.float32
                assert not np.isnan(out).any()
                assert rel_err(out, ref) < 1e-5, (transposed, ex.factors.mode, prescale)
                # the isolated rows carry only the self term (0 without one)
                iso = np.flatnonzero(np.diff(plan.local_indptr) == 0)
                np.testing.assert_allclose(out[iso], ref[iso], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dim", (3, 16, 64, 512))
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
def test_weighted_path(kind, dim):
    """kind=None forces the per-edge weights; perturbed weights must fall back to them."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(dim + 1).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    for transposed, plan in cpu_plans(indptr, indices, kind).items():
        ex = CsrRowsExecutor(plan, None, None, chunk=300)
        assert ex.factors.mode == "weighted"
        ref = aggregate_reference(indptr, indices, x, kind, transposed)
        assert rel_err(run(ex, x, 1)[0], ref) < 1e-5
    plan = cpu_plans(indptr, indices, kind)[False]
    rng = np.random.default_rng(3)
    plan.local_weight = (plan.local_weight * rng.uniform(0.5, 2.0, plan.num_local_edges)).astype(np.float32)
    ex = CsrRowsExecutor(plan, None, kind, chunk=300)
    assert ex.factors.mode == "weighted"
    rows = np.repeat(np.arange(plan.n_local), np.diff(plan.local_indptr))
    ref = np.zeros((plan.n_local, dim))
    np.add.at(ref, rows, plan.local_weight[:, None].astype(np.float64) * x[plan.local_indices])
    if plan.has_self:
        ref += plan.self_weight[:, None].astype(np.float64) * x
    assert rel_err(run(ex, x, 1)[0], ref) < 1e-5


def test_strided_input_and_no_edges():
    indptr, indices = hub_graph()
    n = len(indptr) - 1
    big = np.random.default_rng(0).standard_normal((n, 21)).astype(np.float32)
    plan = cpu_plans(indptr, indices, "gcn")[False]
    ex = CsrRowsExecutor(plan, None, "gcn")
    xt = torch.from_numpy(big).cuda()[:, 1:17]  # D = 16 but not contiguous: padded copy path
    out = ex(xt).cpu().numpy()
    assert rel_err(out, aggregate_reference(indptr, indices, big[:, 1:17], "gcn")) < 1e-5
    empty_ptr = np.zeros(n + 1, np.int64)
    eplan = cpu_plans(empty_ptr, np.zeros(0, np.int64), "gcn")[True]
    ex = CsrRowsExecutor(eplan, None, "gcn")
    ex.poison = True
    out = ex(torch.from_numpy(big).cuda()).cpu().numpy()
    np.testing.assert_allclose(out, big, rtol=1e-6)  # deg 0: diag = 1 / (0 + 1)


def test_large_hub_graph_many_warps():
    """More warps than resident slots, long hubs, at D=64 (the benchmark's shape class)."""
    from mgg.testing.graphs import random_csr

    indptr, indices = random_csr(20000, 600000, seed=2)
    hub = np.random.default_rng(1).integers(0, 20000, 50000)
    src = np.concatenate([np.repeat(np.arange(20000), np.diff(indptr)), np.zeros(50000, np.int64)])
    dst = np.concatenate([indices, hub])
    order = np.argsort(src, kind="stable")
    ip = np.zeros(20001, np.int64)
    np.cumsum(np.bincount(src, minlength=20000), out=ip[1:])
    ind = dst[order]
    x = np.random.default_rng(4).standard_normal((20000, 64)).astype(np.float32)
    for kind in ("sum", "gcn"):
        for transposed, plan in cpu_plans(ip, ind, kind).items():
            ex = CsrRowsExecutor(plan, None, kind)
            out = run(ex, x, 1)[0]
            assert rel_err(out, aggregate_reference(ip, ind, x, kind, transposed)) < 1e-5


@pytest.mark.parametrize("segments", (2, 3, 7))
@pytest.mark.parametrize("mapping", (("default", 8, 1024), ("packed", 8, 1024), ("bundles", 1, 1024),
                                     ("scan", 8, 1024), ("scan", 8, 7)))
@pytest.mark.parametrize("dim", (1, 8, 16, 32, 33, 64, 512))
@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
def test_source_segments(kind, dim, mapping, segments):
    """The CSR run as `segments` passes over source ranges (the first writes with the self term,
    the others add, skipping their empty rows) equals the float64 reference: forward and
    transposed plans, hubs split (the combine pass adds too), both column forms, per-edge
    weights, and the visit order is a permutation of the entries."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(dim + segments).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    for transposed, plan in cpu_plans(indptr, indices, kind).items():
        ref = aggregate_reference(indptr, indices, x, kind, transposed)
        for k in (kind, None):  # the factored weights, then the per-edge weight stream
            ex = CsrRowsExecutor(plan, None, k, chunk=500, row_mapping=mapping[0], bundle_batches=mapping[1],
                                 source_segments=segments, scan_run=mapping[2])
            assert ex.segments_for(dim) == segments
            for prescale in ((True, False) if ex.can_prescale else (ex.prescale,)):
                ex.prescale = prescale
                for out in run(ex, x):
                    assert not np.isnan(out).any()
                    assert rel_err(out, ref) < 1e-5, (transposed, k, prescale)
            order = ex.visit_order(dim).cpu().numpy()
            assert np.array_equal(np.sort(order), np.arange(plan.num_local_edges))
        seg = ex.segments(segments)
        assert sum(s.num_entries for s in seg) == plan.num_local_edges


@pytest.mark.parametrize("dim", (8, 16))
@pytest.mark.parametrize("segments", (1, 3, 7))
@pytest.mark.parametrize("kind", ["gcn", "sum_self", "mean"])
def test_scan_forms(kind, segments, dim):
    """The scan kernel in each form the executor launches, against the float64 reference (forward
    and transposed, hubs split and whole-row long tasks): the row factor packed with the row ends
    (loaded instead where the column factor is read per edge, prescale off), the self term in its
    source segment's pass, GCN's self weight taken from the packed rf (4 lanes, D = 16) or loaded
    (2 lanes, D = 8); the pre-scaled and the producer-scaled forms, and the backward's form
    without the row factor."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(segments).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
    for transposed, plan in cpu_plans(indptr, indices, kind).items():
        ref = aggregate_reference(indptr, indices, x, kind, transposed)
        ex = CsrRowsExecutor(plan, None, kind, chunk=500, row_mapping="scan", source_segments=segments, scan_run=7)
        assert ex.self_is_rf == (kind == "gcn")
        assert ex.short_mapping(*ex._layout(dim)[2:]) == "scan"
        xt = torch.from_numpy(x).cuda()
        xs = xt * ex.cf[:, None] if ex.takes_scaled_input else None
        rf = ex.rf.double().cpu().numpy() if ex.takes_scaled_input else None
        for prescale in ((True, False) if ex.can_prescale else (ex.prescale,)):
            ex.prescale = prescale
            ex.poison = True
            out = ex(xt).cpu().numpy()
            assert rel_err(out, ref) < 1e-5, (transposed, prescale)
            if xs is not None:
                out = ex(xs, scaled_input=True).cpu().numpy()
                assert rel_err(out, ref) < 1e-5, (transposed, prescale, "scaled input")
                # the backward's form: the output without its row factor (rf > 0 for gcn)
                out = ex(xt, row_factor=False).cpu().numpy()
                assert rel_err(out, ref / rf[:, None]) < 1e-5, (transposed, prescale, "no row factor")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_source_segments_16bit(dtype):
    indptr, indices = hub_graph()
    x = np.random.default_rng(5).standard_normal((len(indptr) - 1, 24)).astype(np.float32)
    xr = torch.from_numpy(x).to(dtype).float().numpy()  # what the kernels read
    plan = cpu_plans(indptr, indices, "gcn")[False]
    ex = CsrRowsExecutor(plan, None, "gcn", storage_dtype=dtype, chunk=500, source_segments=3)
    ref = aggregate_reference(indptr, indices, xr, "gcn")
    assert rel_err(run(ex, x, 1)[0], ref) < 1e-5


@pytest.mark.parametrize("dtype", (torch.bfloat16,))
@pytest.mark.parametrize("segments", (1, 3))
def test_scaled_input_16bit(dtype, segments):
    """bf16 storage takes the gcn factor's scaled forms natively (w = 1 on the scaled table,
    rounded once): scaled_input (the table is x as given) and row_factor=False (the table is
    cf * x), forward and transposed, on the scan kernel and on the default mapping; against the
    reference on the rounded scaled rows."""
    indptr, indices = hub_graph()
    x = np.random.default_rng(segments).standard_normal((len(indptr) - 1, 16)).astype(np.float32)
    xt = torch.from_numpy(x).cuda()
    for transposed, plan in cpu_plans(indptr, indices, "gcn").items():
        for mapping in ("scan", "default"):
            ex = CsrRowsExecutor(plan, None, "gcn", storage_dtype=dtype, chunk=500, row_mapping=mapping,
                                 source_segments=segments, scan_run=7)
            assert ex.takes_scaled_input and ex.self_is_rf
            cf = ex.cf.double().cpu().numpy()[:, None]
            xs = xt * ex.cf[:, None]
            r = xs.to(dtype).double().cpu().numpy()  # the rounded scaled rows the kernels read
            ref = aggregate_reference(indptr, indices, r / cf, "gcn", transposed)
            ex.poison = True
            out = ex(xs, scaled_input=True).cpu().numpy()
            assert rel_err(out, ref) < 1e-5, (transposed, mapping, "scaled input")
            out = ex(xt, row_factor=False).cpu().numpy()  # cf * x rounded once, no row factor
            assert rel_err(out, ref / ex.rf.double().cpu().numpy()[:, None]) < 1e-5, (transposed, mapping)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("n,dim", [(1, 1), (7, 3), (1000, 8), (1000, 13), (999, 16), (500, 24), (300, 33),
                                   (64, 100), (5, 1024)])
@pytest.mark.parametrize("aligned", (True, False))
def test_table16_is_torchs_rounding_of_the_scaled_rows(dtype, n, dim, aligned):
    """mgg_csr_table16 (the 16-bit table of a P = 1 call): round16(s * x) bit for bit as torch's
    multiply-then-cast (round to nearest even; NaN, inf, overflow and subnormals included), and
    round16(x) without s; the padding to a multiple of 8 is zero (the output poisoned first);
    x 16-byte aligned (float4 loads where D % 4 == 0) or not (element loads)."""
    indptr, indices = hub_graph()
    ex = CsrRowsExecutor(cpu_plans(indptr, indices, "gcn")[False], None, "gcn", storage_dtype=dtype)  # its module
    g = torch.Generator(device="cuda").manual_seed(n * 1000 + dim)
    flat = torch.empty(n * dim + 1, device="cuda")
    x = (flat[1:] if not aligned else flat[:-1]).view(n, dim)
    x.copy_(torch.randn(n, dim, device="cuda", generator=g) * 10.0 ** torch.randint(-9, 6, (n, dim), device="cuda",
                                                                                   generator=g))
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38, 7e4, -7e4, 1e-40, 3e-8, -0.0, 65519.9],
                            device="cuda")
    x.view(-1)[:min(x.numel(), specials.numel())] = specials[:x.numel()]
    s = torch.rand(n, device="cuda", generator=g) + 0.25
    dp = -(-dim // 8) * 8
    for scale in (None, s):
        out = torch.full((n, dp), -1, dtype=torch.int16, device="cuda").view(dtype)  # poison
        ex._table16(x, out, scale)
        want = (x if scale is None else x * scale.unsqueeze(1)).to(dtype)
        got = out[:, :dim]
        nan = want.isnan()  # any NaN pattern is a NaN: compare the others bit for bit
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan]), (scale is None)
        assert not out[:, dim:].view(torch.int16).any()


def test_source_segments_auto_per_mapping(monkeypatch):
    """The automatic rule as the executor applies it, with the L2 set to the table's size (and the
    entries-per-row floor lowered for this small graph): a layout on the scan kernel takes
    MAX_AUTO_SEGMENTS_SCAN segments, one on the row kernels MAX_AUTO_SEGMENTS, a layout of two
    vectors a lane one; the output at the picked count matches the reference."""
    import mgg.kernels.source_segments as ss
    from mgg.kernels.source_segments import (AUTO_MIN_TABLE_L2_SCAN_16, MAX_AUTO_SEGMENTS, MAX_AUTO_SEGMENTS_SCAN,
                                             MAX_AUTO_SEGMENTS_SCAN_16)

    monkeypatch.setattr(ss, "AUTO_MIN_ENTRIES_PER_ROW", 1)
    indptr, indices = hub_graph()
    plan = cpu_plans(indptr, indices, "sum")[False]
    for mapping, dim, want in (("default", 16, MAX_AUTO_SEGMENTS_SCAN), ("default", 8, MAX_AUTO_SEGMENTS_SCAN),
                               ("scan", 32, MAX_AUTO_SEGMENTS_SCAN), ("default", 32, MAX_AUTO_SEGMENTS),
                               ("packed", 16, MAX_AUTO_SEGMENTS), ("default", 256, 1)):
        ex = CsrRowsExecutor(plan, None, "sum", row_mapping=mapping, chunk=500)
        dv, _, lanes, vpl = ex._layout(dim)
        ex.l2_bytes = plan.n_local * dv * 16  # the table is one L2
        assert ex.segments_for(dim) == want, (mapping, dim, ex.short_mapping(lanes, vpl))
        x = np.random.default_rng(dim).standard_normal((len(indptr) - 1, dim)).astype(np.float32)
        out = run(ex, x, 1)[0]
        assert rel_err(out, aggregate_reference(indptr, indices, x, "sum")) < 1e-5, (mapping, dim)
    # a plan with a self term on the scan kernel takes the scan's count too (each pass adds the
    # self term of its own source range)
    for kind, ratio, want in (("gcn", 2.5, MAX_AUTO_SEGMENTS_SCAN), ("sum_self", 2.5, MAX_AUTO_SEGMENTS_SCAN),
                              ("gcn", 1.0, MAX_AUTO_SEGMENTS_SCAN), ("sum", 2.5, MAX_AUTO_SEGMENTS_SCAN)):
        kplan = cpu_plans(indptr, indices, kind)[False]
        ex = CsrRowsExecutor(kplan, None, kind, row_mapping="scan", chunk=500)
        ex.l2_bytes = int(kplan.n_local * 4 * 16 / ratio)  # D = 16: four float4s a row
        assert ex.segments_for(16) == want, (kind, ratio)
        x = np.random.default_rng(3).standard_normal((len(indptr) - 1, 16)).astype(np.float32)
        assert rel_err(run(ex, x, 1)[0], aggregate_reference(indptr, indices, x, kind)) < 1e-5, (kind, ratio)
    # a 16-bit table on the scan kernel: MAX_AUTO_SEGMENTS_SCAN_16 from AUTO_MIN_TABLE_L2_SCAN_16 L2s
    for kind, ratio, want in (("gcn", 0.65, MAX_AUTO_SEGMENTS_SCAN_16), ("sum", 2.5, MAX_AUTO_SEGMENTS_SCAN_16),
                              ("sum", AUTO_MIN_TABLE_L2_SCAN_16 * 0.9, 1)):
        kplan = cpu_plans(indptr, indices, kind)[False]
        ex = CsrRowsExecutor(kplan, None, kind, row_mapping="scan", chunk=500, storage_dtype=torch.bfloat16)
        ex.l2_bytes = int(kplan.n_local * 2 * 16 / ratio)  # D = 16 in bf16: two 16-byte vectors a row
        assert ex.segments_for(16) == want, (kind, ratio)


def test_source_segments_auto_and_knob():
    """Automatic: one segment for a table within a few L2s (this small graph); the knob is
    checked and retune switches it."""
    indptr, indices = hub_graph()
    plan = cpu_plans(indptr, indices, "sum")[False]
    ex = CsrRowsExecutor(plan, None, "sum")
    assert ex.source_segments is None and ex.segments_for(16) == 1
    ex.retune(source_segments=4)
    assert ex.segments_for(16) == 4
    ex.retune(wpb=8)  # other knobs leave it
    assert ex.segments_for(16) == 4
    with pytest.raises(ValueError, match="source_segments"):
        ex.retune(source_segments=0)
    with pytest.raises(ValueError, match="source_segments"):
        CsrRowsExecutor(plan, None, "sum", source_segments=2.5)
    with pytest.raises(ValueError, match="source_segments"):
        CsrRowsExecutor(plan, None, "sum", source_segments=True)
