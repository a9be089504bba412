"""mgg.kernels.source_segments: a CSR cut by source range, against a numpy reference (CPU)."""
import numpy as np
import pytest
import torch

from mgg.kernels.source_segments import (AUTO_MAX_TABLE_L2, AUTO_MIN_ENTRIES_PER_ROW, AUTO_MIN_TABLE_L2,
                                         AUTO_MIN_TABLE_L2_SCAN_16, MAX_AUTO_SEGMENTS_SCAN, MAX_AUTO_SEGMENTS_SCAN_16,
                                         auto_source_segments, source_segment_order, split_by_source)


def random_csr(n, n_src, seed, max_deg=40):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_deg, n)
    deg[rng.choice(n, n // 5, replace=False)] = 0
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    src = np.concatenate([np.sort(rng.choice(n_src, d, replace=False)) for d in deg]).astype(np.int32)
    return indptr, src, rng.standard_normal(len(src)).astype(np.float32)


@pytest.mark.parametrize("segments", (1, 2, 3, 5, 17))
def test_split_matches_numpy(segments):
    n, n_src = 300, 257
    indptr, src, wt = random_csr(n, n_src, segments)
    parts = split_by_source(torch.from_numpy(indptr), torch.from_numpy(src), torch.from_numpy(wt), n_src, segments)
    size = -(-n_src // segments)
    assert len(parts) == segments
    rows = np.repeat(np.arange(n), np.diff(indptr))
    seen = np.zeros(len(src), int)
    order = source_segment_order(torch.from_numpy(src), n_src, segments).numpy()
    start = 0
    for k, p in enumerate(parts):
        lo, hi = k * size, min((k + 1) * size, n_src)
        assert (p.lo, p.hi) == (lo, hi)
        ip, s, w = p.indptr.numpy(), p.src.numpy(), p.wt.numpy()
        pos = order[start:start + p.num_entries]
        start += p.num_entries
        assert p.src.dtype == torch.int32 and p.indptr.dtype == torch.int64 and len(ip) == n + 1
        # reference: the entries with a source in [lo, hi), row by row, in their order in the row
        want = np.flatnonzero((src >= lo) & (src < hi))
        assert np.array_equal(pos, want)
        assert np.array_equal(s, src[want]) and np.array_equal(w, wt[want])
        assert np.array_equal(np.diff(ip), np.bincount(rows[want], minlength=n))
        seen[pos] += 1
    assert (seen == 1).all() and start == len(src)


def test_split_without_weights_and_empty():
    indptr, src, _ = random_csr(50, 50, 1)
    parts = split_by_source(torch.from_numpy(indptr), torch.from_numpy(src), None, 50, 4)
    assert all(p.wt is None for p in parts)
    empty = split_by_source(torch.zeros(11, dtype=torch.int64), torch.zeros(0, dtype=torch.int32), None, 10, 3)
    assert [p.num_entries for p in empty] == [0, 0, 0] and all(int(p.indptr[-1]) == 0 for p in empty)


def test_bad_input_names_the_problem():
    indptr, src, _ = random_csr(20, 20, 2, max_deg=15)
    with pytest.raises(ValueError, match="source segments must be >= 1"):
        split_by_source(torch.from_numpy(indptr), torch.from_numpy(src), None, 20, 0)
    with pytest.raises(ValueError, match=r"source rows must lie in \[0, 10\)"):
        split_by_source(torch.from_numpy(indptr), torch.from_numpy(src), None, 10, 2)


def test_auto_rule():
    l2 = 50 << 20
    assert auto_source_segments(int(l2 * AUTO_MIN_TABLE_L2) - 1, l2) == 1
    assert auto_source_segments(int(l2 * AUTO_MIN_TABLE_L2), l2) == 2
    assert auto_source_segments(int(l2 * 2.5), l2) == 2  # products-like at D = 16 on an H200
    assert auto_source_segments(int(l2 * 0.25), l2) == 1  # reddit-like at D = 16
    assert auto_source_segments(int(l2 * AUTO_MAX_TABLE_L2) + 1, l2) == 1  # D = 64 lost with two
    # 16-bit rows count as stored (one H200, products-like, 2.45M rows: bf16 D = 16 is 78 MB and
    # ran 1.04-1.09x faster in two; D = 64, 314 MB, lost with two)
    assert auto_source_segments(2_449_029 * 32, l2, entries_per_row=25.3) == 2
    assert auto_source_segments(2_449_029 * 128, l2, entries_per_row=25.3) == 1
    assert auto_source_segments(10, 0) == 1
    # the scan mapping's passes cost less: three where the row kernels take two, one elsewhere
    assert auto_source_segments(int(l2 * 2.5), l2, most=MAX_AUTO_SEGMENTS_SCAN) == MAX_AUTO_SEGMENTS_SCAN == 3
    assert auto_source_segments(int(l2 * 0.25), l2, most=MAX_AUTO_SEGMENTS_SCAN) == 1
    # a 16-bit table on the scan kernel: two from AUTO_MIN_TABLE_L2_SCAN_16 L2s (CsrRowsExecutor.segments_for)
    assert AUTO_MIN_TABLE_L2_SCAN_16 < AUTO_MIN_TABLE_L2 and MAX_AUTO_SEGMENTS_SCAN_16 == 2
    for ratio, want in ((0.65, 2), (1.3, 2), (AUTO_MIN_TABLE_L2_SCAN_16 * 0.99, 1), (AUTO_MAX_TABLE_L2 * 1.01, 1)):
        assert auto_source_segments(int(l2 * ratio), l2, most=MAX_AUTO_SEGMENTS_SCAN_16,
                                    min_l2=AUTO_MIN_TABLE_L2_SCAN_16) == want, ratio
    with pytest.raises(ValueError, match="most must be >= 1"):
        auto_source_segments(int(l2 * 2.5), l2, most=0)
    # a sparse CSR (a row-subset plan) stays in one whatever its table
    assert auto_source_segments(int(l2 * 2.5), l2, entries_per_row=AUTO_MIN_ENTRIES_PER_ROW - 0.1) == 1
    assert auto_source_segments(int(l2 * 2.5), l2, entries_per_row=25.3) == 2


@pytest.mark.parametrize("bad", [0, 65, 2.5, True, "2"])
def test_executor_refuses_a_bad_segment_count_before_any_gpu_work(bad):
    from mgg.kernels.csr_rows import CsrRowsExecutor

    with pytest.raises(ValueError, match=r"source_segments must be an integer in \[1, 64\]"):
        CsrRowsExecutor(None, None, "sum", source_segments=bad)
