"""CPU side of the csr_rows kernels: the row schedule, the weight factorisation, bad input, and
that local_csr.cu compiles (when nvcc is installed). The GPU results are in
tests/kernels/test_local_csr_gpu.py."""
import os
import shutil

import numpy as np
import pytest
import torch

from mgg.kernels.csr_rows import CsrRowsExecutor, factor_weights, lanes_for_width, row_schedule
from mgg.testing.reference import aggregation_matrix
from mgg.graph import DistGraph, RuntimeConfig
from mgg.runtime.comm import Communicator
from mgg.runtime.partition import partition_ranges
from mgg.runtime.plan import build_plan
from mgg.testing.graphs import power_law_csr, random_csr


def emulate(sched, indptr, indices, w, x):
    """What mgg_csr_rows + mgg_csr_combine compute from a schedule (float64), and how often each
    output row is written."""
    n = len(indptr) - 1
    out = np.full((n, x.shape[1]), np.nan)
    writes = np.zeros(n, np.int64)
    partial = np.zeros((sched.num_slots, x.shape[1]))
    used = np.zeros(len(indices), np.int64)
    for t, s, e, slot in sched.long_tasks:
        acc = (w[s:e, None] * x[indices[s:e]]).sum(0)
        used[s:e] += 1
        assert indptr[t] <= s <= e <= indptr[t + 1]
        if slot < 0:
            out[t] = acc
            writes[t] += 1
        else:
            partial[slot] = acc
    bundled = [t for r0, r1 in (sched.bundles if sched.bundles is not None else []) for t in range(r0, r1)]
    for t in list(sched.short_rows) + bundled:
        s, e = indptr[t], indptr[t + 1]
        assert e - s <= sched.long_threshold
        out[t] = (w[s:e, None] * x[indices[s:e]]).sum(0)
        used[s:e] += 1
        writes[t] += 1
    for t, first, cnt in sched.split:
        out[t] = partial[first:first + cnt].sum(0)
        writes[t] += 1
    assert np.all(used == 1)  # every entry exactly once
    return out, writes


@pytest.mark.parametrize("groups,thr,chunk", [(8, None, 2048), (1, 0, 64), (32, 5, 100), (2, 64, 7)])
def test_schedule_covers_every_row_once(groups, thr, chunk):
    indptr, indices = power_law_csr(3000, seed=groups + chunk)
    w = np.random.default_rng(1).standard_normal(len(indices))
    x = np.random.default_rng(2).standard_normal((3000, 3))
    sched = row_schedule(indptr, groups, thr, chunk)
    out, writes = emulate(sched, indptr, indices, w, x)
    assert np.all(writes == 1)
    m = aggregation_matrix(indptr, indices, "sum")
    m.data = w
    np.testing.assert_allclose(out, m @ x, rtol=1e-10, atol=1e-10)
    lens = sched.long_tasks[:, 2] - sched.long_tasks[:, 1]
    assert np.all(np.diff(lens) <= 0)                       # longest first
    assert lens.max(initial=0) <= chunk
    if chunk < 700:
        assert len(sched.split) >= 3                        # the hubs are split
    assert np.all(np.diff(np.diff(indptr)[sched.short_rows]) <= 0)
    assert sched.num_warps == len(sched.long_tasks) + -(-len(sched.short_rows) // groups)


@pytest.mark.parametrize("groups,thr,target", [(8, None, 64), (2, 64, 128), (16, 0, 1), (4, 5, 3)])
def test_bundles_cover_every_short_row_once_in_runs(groups, thr, target):
    """Bundles: runs of consecutive short rows (no long row inside), about `target` entries each
    (plus the last row's tail), most entries first; with the long tasks every row written once."""
    indptr, indices = power_law_csr(3000, seed=groups + target)
    w = np.random.default_rng(1).standard_normal(len(indices))
    x = np.random.default_rng(2).standard_normal((3000, 3))
    sched = row_schedule(indptr, groups, thr, 2048, bundle_target=target)
    assert len(sched.short_rows) == 0 and sched.bundles.shape[1] == 2
    out, writes = emulate(sched, indptr, indices, w, x)
    assert np.all(writes == 1)
    m = aggregation_matrix(indptr, indices, "sum")
    m.data = w
    np.testing.assert_allclose(out, m @ x, rtol=1e-10, atol=1e-10)
    deg = np.diff(indptr)
    r0, r1 = sched.bundles[:, 0], sched.bundles[:, 1]
    assert np.all(r1 > r0)
    work = indptr[r1] - indptr[r0] + (r1 - r0)                     # an entry or a row: a unit each
    assert np.all(np.diff(work) <= 0)                              # most work first
    longest_short = deg[deg <= sched.long_threshold].max()
    assert work.max() <= target + longest_short + 1                # a run stops once past a multiple
    assert sched.num_warps == len(sched.long_tasks) + -(-len(sched.bundles) // groups)
    with pytest.raises(ValueError, match="skip_empty"):
        row_schedule(indptr, groups, thr, 2048, skip_empty=True, bundle_target=target)


@pytest.mark.parametrize("target", [0, 40])
def test_visit_order_is_a_permutation_in_task_order(target):
    """visit_order: every entry once; the long tasks' ranges first (in task order), then each
    short item's entries contiguous, in item order."""
    from mgg.kernels.csr_rows import visit_order

    indptr, indices = power_law_csr(2000, seed=5 + target)
    sched = row_schedule(indptr, 4, 64, 300, bundle_target=target)
    order = visit_order(sched, torch.from_numpy(indptr)).numpy()
    assert order.dtype == np.int64 and np.array_equal(np.sort(order), np.arange(len(indices)))
    ranges = [(int(s), int(e)) for _, s, e, _ in sched.long_tasks]
    if target:
        ranges += [(int(indptr[a]), int(indptr[b])) for a, b in sched.bundles]
    else:
        ranges += [(int(indptr[r]), int(indptr[r + 1])) for r in sched.short_rows]
    expect = np.concatenate([np.arange(s, e) for s, e in ranges])
    np.testing.assert_array_equal(order, expect)


@pytest.mark.parametrize("window", [1, 7, 64])
def test_bundle_window_keeps_row_order_between_windows(window):
    """bundle_window = w: the same runs as without, in windows of w runs of row order, by size
    (most entries first) inside each window."""
    from mgg.kernels.csr_rows import bundle_rows

    indptr, _ = power_law_csr(2500, seed=window)
    ip = torch.from_numpy(indptr)
    is_long = (ip[1:] - ip[:-1]) > 60
    by_size = bundle_rows(ip, is_long, 30).numpy()
    windowed = bundle_rows(ip, is_long, 30, window).numpy()
    rows_order = by_size[np.argsort(by_size[:, 0])]
    assert np.array_equal(np.sort(windowed[:, 0]), rows_order[:, 0])
    for k in range(0, len(windowed), window):
        part = windowed[k:k + window]
        assert np.array_equal(np.sort(part[:, 0]), rows_order[k:k + window, 0])
        work = indptr[part[:, 1]] - indptr[part[:, 0]] + (part[:, 1] - part[:, 0])
        assert np.all(np.diff(work) <= 0)
    with pytest.raises(ValueError, match="window"):
        bundle_rows(ip, is_long, 30, -1)


def test_a_run_of_empty_rows_is_cut_like_entries():
    """Rows without entries count one unit each: a degree-sorted CSR's 10,000 trailing empty rows
    become runs of at most `target` rows (not one run that one lane group walks alone), and
    every row is still covered once."""
    from mgg.kernels.csr_rows import bundle_rows

    deg = np.concatenate([np.full(500, 20), np.zeros(10000, np.int64)])
    indptr = np.concatenate([[0], np.cumsum(deg)])
    ip = torch.from_numpy(indptr)
    runs = bundle_rows(ip, torch.zeros(len(deg), dtype=torch.bool), 64).numpy()
    assert (runs[:, 1] - runs[:, 0]).max() <= 64
    covered = np.concatenate([np.arange(a, b) for a, b in runs])
    assert np.array_equal(np.sort(covered), np.arange(len(deg)))
    empty = runs[runs[:, 0] >= 500]
    assert len(empty) >= 10000 // 64


def test_bundles_pay_when_a_bundle_holds_two_short_rows():
    """bundles_pay: mean degree of the short rows (<= threshold) against half the target."""
    from mgg.kernels.csr_rows import bundles_pay

    deg = np.array([10, 30, 500, 20, 0])            # short rows (<= 100): 10, 30, 20, 0 -> mean 15
    ip = np.concatenate([[0], np.cumsum(deg)])
    assert bundles_pay(ip, 100, 30) and bundles_pay(torch.from_numpy(ip), 100, 31)
    assert not bundles_pay(ip, 100, 29)
    assert not bundles_pay(np.array([0, 500]), 100, 64)   # no short row
    assert bundles_pay(ip, 1000, 2 * 112)                 # every row short: mean 112


def test_row_knobs_are_checked_by_name():
    from mgg.kernels.csr_rows import check_row_knobs

    check_row_knobs("packed", 1)
    check_row_knobs("default", 1)
    check_row_knobs(None, None)
    with pytest.raises(ValueError, match="row_mapping must be one of"):
        check_row_knobs("auto", None)
    with pytest.raises(ValueError, match="bundle_batches must be >= 1"):
        check_row_knobs(None, 0)
    with pytest.raises(ValueError, match="bundle_window must be >= 0"):
        check_row_knobs(None, None, -2)
    check_row_knobs("scan", None, None, None, 1)
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="scan_run must be an integer >= 1"):
            check_row_knobs(None, None, None, None, bad)


def _plans(indptr, indices, kind):
    comm = Communicator()
    with DistGraph(indptr, indices, comm, RuntimeConfig(backend="cpu")) as dg:
        return dg.plan(kind, False), dg.plan(kind, True)


@pytest.mark.parametrize("kind,fwd_mode,bwd_mode", [("sum", "one", "one"), ("mean", "one", "column"),
                                                    ("gcn", "column", "column")])
def test_weight_factors_reproduce_the_plan(kind, fwd_mode, bwd_mode):
    indptr, indices = random_csr(600, 8000, seed=4)
    for plan, mode in zip(_plans(indptr, indices, kind), (fwd_mode, bwd_mode)):
        f = factor_weights(plan, kind)
        assert f.mode == mode, f.note
        rows = np.repeat(np.arange(plan.n_local), np.diff(plan.local_indptr))
        got = np.ones(plan.num_local_edges)
        if f.row is not None:
            got *= f.row[rows]
        if f.col is not None:
            got *= f.col[plan.local_indices]
        np.testing.assert_allclose(got, plan.local_weight, rtol=2e-6, atol=0)


def test_weight_factors_fall_back_when_weights_do_not_factor():
    indptr, indices = random_csr(300, 3000, seed=8)
    for kind in ("sum", "mean", "gcn"):
        plan, _ = _plans(indptr, indices, kind)
        plan.local_weight = plan.local_weight.copy()
        plan.local_weight[7] *= 1.5
        assert factor_weights(plan, kind).mode == "weighted", kind
    assert factor_weights(plan, None).mode == "weighted"


def test_refuses_remote_work_and_wide_rows():
    indptr, indices = random_csr(200, 2000, seed=1)
    bounds = partition_ranges(indptr, 2)
    plan = build_plan(indptr[: bounds[1] + 1], indices[: indptr[bounds[1]]],
                      np.ones(indptr[bounds[1]], np.float32), None, bounds, 0)
    assert plan.num_remote_edges > 0
    with pytest.raises(ValueError, match="remote edges"):
        CsrRowsExecutor(plan, None, "sum")
    assert lanes_for_width(512) == (32, 4)
    assert lanes_for_width(16) == (4, 1)
    with pytest.raises(ValueError, match="limit of 512"):
        lanes_for_width(516)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_local_csr_compiles_without_nvshmem(kernel_cache_dir, monkeypatch):
    from mgg.kernels.build import build_cubin

    monkeypatch.setenv("MGG_KERNEL_CACHE", str(kernel_cache_dir))
    b = build_cubin("local_csr", "sm_90", nvshmem=False, part="fp32")  # the part every run loads
    assert os.path.getsize(b.path) > 0 and b.method == "plain"


def test_scan_launcher_geometry_and_refusals():
    """launch_csr_scan (no GPU: a recording launch cache): one warp a long task or run, SCAN_WPB
    warps a block, the combine pass for split hub rows, the self term's rows passed to both; a
    layout without a scan kernel, a schedule of lane-group items, packed row ends that do not fit
    and a self weight from rf without them are refused by name."""
    import contextlib

    from mgg.kernels.csr_rows import SCAN_WPB, launch_csr_scan, row_schedule

    calls = []

    class Recorder:
        def stream(self):
            return contextlib.nullcontext()

        def function(self, module, name):
            return lambda grid, block, args: calls.append((name, grid, block, args))

    ip = torch.tensor([0, 3, 3, 2003, 2010, 2012], dtype=torch.int64)   # row 2: a hub split in 4
    runs = row_schedule(ip, 1, 100, 500, bundle_target=8)
    t = torch.zeros(4, 4)
    launch_csr_scan(None, 4, 1, 132, runs, t, t, None, None, None, None, t, 4, t, t, cache=Recorder())
    (name, grid, block, args), (cname, _, cblock, _) = calls
    warps = len(runs.long_tasks) + len(runs.bundles)
    assert len(runs.long_tasks) == 4 and name == "mgg_csr_scan_l4_w1" and cname == "mgg_csr_combine"
    assert grid == (-(-warps // SCAN_WPB),) and block == (32 * SCAN_WPB,) and cblock == (256,)
    assert int(args[0]) == 4 and int(args[2]) == len(runs.bundles)
    with pytest.raises(ValueError, match="scan mapping takes"):
        launch_csr_scan(None, 16, 1, 132, runs, t, t, None, None, None, None, t, 4, t, t, cache=Recorder())
    with pytest.raises(ValueError, match="schedule of runs"):
        launch_csr_scan(None, 4, 1, 132, row_schedule(ip, 8, 100, 500), t, t, None, None, None, None, t, 4, t, t,
                        cache=Recorder())
    assert (int(args[-3]), int(args[-2]), int(args[-1])) == (0, 1 << 62, 0)  # every row's self term
    # an adding pass may take the self term of its rows; the combine pass gets the same rows
    calls.clear()
    ip5 = ip[:6]
    rf = torch.ones(5)
    ends = torch.zeros(5, dtype=torch.int64)
    launch_csr_scan(None, 4, 1, 132, runs, ip5, t, None, None, rf, rf, t, 4, t, t, add=True, cache=Recorder(),
                    ends_rf=ends, self_rows=(2, 4), self_rf=True)
    (_, _, _, args), (_, _, _, cargs) = calls
    assert (int(args[-3]), int(args[-2]), int(args[-1])) == (2, 4, 1) and int(args[-4]) == ends.data_ptr()
    assert (int(cargs[-2]), int(cargs[-1])) == (2, 4)
    with pytest.raises(ValueError, match="ends_rf"):
        launch_csr_scan(None, 4, 0, 132, runs, ip5, t, None, None, rf, None, t, 4, t, t, cache=Recorder(), ends_rf=ends)
    with pytest.raises(ValueError, match="ends_rf"):
        launch_csr_scan(None, 4, 1, 132, runs, ip5, t, None, None, rf, None, t, 4, t, t, cache=Recorder(),
                        ends_rf=ends[:4])
    with pytest.raises(ValueError, match="self_rf"):
        launch_csr_scan(None, 4, 1, 132, runs, ip5, t, None, None, rf, rf, t, 4, t, t, cache=Recorder(), self_rf=True)
    src = torch.zeros(9, dtype=torch.int32)
    with pytest.raises(ValueError, match="src in 8-byte vectors at 4 lanes"):
        launch_csr_scan(None, 4, 1, 132, runs, t, src[1:], None, None, None, None, t, 4, t, t, cache=Recorder())
    with pytest.raises(ValueError, match="src in 16-byte vectors at 2 lanes"):
        launch_csr_scan(None, 2, 1, 132, runs, t, src[2:], None, None, None, None, t, 1, t, t, cache=Recorder())
    launch_csr_scan(None, 8, 1, 132, runs, t, src[1:], None, None, None, None, t, 4, t, t, cache=Recorder())
    # 16-bit storage: its own kernels, dv quads of 8 bytes; the combine pass takes dv / 2 vectors
    calls.clear()
    launch_csr_scan(None, 4, 0, 132, runs, t, t, t, None, None, None, t, 4, t, t, cache=Recorder(), storage="_bf16")
    (name, _, _, args), (cname, _, _, cargs) = calls
    assert name == "mgg_csr_scan_bf16_l4_w0" and cname == "mgg_csr_combine_bf16"
    assert int(args[11]) == 4 and int(cargs[6]) == 2
    with pytest.raises(ValueError, match="an even number of quads, got 3"):
        launch_csr_scan(None, 4, 1, 132, runs, t, t, None, None, None, None, t, 3, t, t, cache=Recorder(),
                        storage="_fp16")
    with pytest.raises(ValueError, match="per-edge weights \\(got mode 2\\)"):
        launch_csr_scan(None, 4, 2, 132, runs, t, t, None, t, None, None, t, 4, t, t, cache=Recorder(),
                        storage="_fp16")
    with pytest.raises(ValueError, match="no scan kernel for storage '_fp8'"):
        launch_csr_scan(None, 4, 1, 132, runs, t, t, None, None, None, None, t, 4, t, t, cache=Recorder(),
                        storage="_fp8")


def test_pack_row_ends_round_trip():
    """pack_row_ends: each row's end in the low 32 bits and its rf's float32 bits in the high 32
    (negative, zero and subnormal factors included), as mgg_csr_scan decodes them; a wrong rf is
    refused by name."""
    from mgg.kernels.csr_rows import pack_row_ends

    indptr = torch.tensor([0, 3, 3, 2**31 - 5, 2**31 - 1], dtype=torch.int64)
    rf = torch.tensor([0.25, -1.5, 0.0, 1e-40], dtype=torch.float32)
    p = pack_row_ends(indptr, rf)
    assert p.dtype == torch.int64 and p.shape == (4,)
    assert torch.equal(p & 0xFFFFFFFF, indptr[1:])
    assert torch.equal((p >> 32).to(torch.int32).view(torch.float32), rf)
    with pytest.raises(ValueError, match="rf must be float32"):
        pack_row_ends(indptr, rf[:3])
