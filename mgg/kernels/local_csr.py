"""Single-GPU aggregation from the plan's local CSR: launcher of mgg/kernels/local_csr.cu.

`CsrRowsExecutor(plan, store, kind)` runs `out = W x + diag * x` for a plan with no remote work
(P = 1, or a rank whose rows need no other rank's data) with the `mgg_csr_rows` kernels: every
output row is written by one warp a pass, no zero-fill (a table of a few L2s runs in source
segments, whose later passes add to the rows by one vector reduction), hub rows are split over
several warps and combined by a tiny second pass, short rows are packed several per warp, and the
per-edge weight array is not read at all where the kind's weights factor exactly:

  one      w = 1 * rf[row]          `sum` (rf = none); `mean` forward (rf = 1 / deg_in(row))
  column   w = cf[col] * rf[row]    `gcn` (cf = rf = dinv); `mean` transposed (cf = 1 / deg_in(col))
  weighted w = plan.local_weight    everything else (and any plan whose weights do not match)

The factorisation is derived from the plan itself (its weights, and its self weights for gcn)
and checked against every plan weight once (`factor_weights`), so it is only used where it
reproduces the plan. Host-side preparation (weights check, row schedule) is a plan-time cost,
recorded in `CsrRowsExecutor.prep_seconds`.

Storage dtype: with `storage_dtype` bfloat16 / float16 the kernels read x as 16-bit rows padded
to a multiple of 8 elements (one 16-byte load = 8 elements), converted to float32 in registers;
sums, partials and the output are float32 (docs/storage-dtype.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..runtime.plan import AggregationPlan
from ..runtime.transfer import host_to_device
from ..runtime.weights import UNIT_WEIGHT_KINDS, dinv_from_self_weight
from .source_segments import (AUTO_MIN_TABLE_L2_SCAN_16, MAX_AUTO_SEGMENTS, MAX_AUTO_SEGMENTS_SCAN,
                              MAX_AUTO_SEGMENTS_SCAN_16, SourceSegment, auto_source_segments, source_segment_order,
                              split_by_source)
from .streams import LaunchCache
from .variants import lane_layout

__all__ = ["CsrRowsExecutor", "RowSchedule", "launch_csr_scan", "SCAN_LANES", "SCAN_DEFAULT_LANES",
           "DEFAULT_SCAN_RUN", "SCAN_LONG_THRESHOLD", "SCAN_WPB", "row_schedule", "bundle_rows", "bundles_pay", "visit_order",
           "entries_per_batch", "BUNDLE_LANES", "ROW_MAPPINGS", "DEFAULT_WPB", "DEFAULT_BUNDLE_WINDOW",
           "WeightFactors", "factor_weights", "launch_csr_rows", "lanes_for_width", "MAX_DIM_PADDED", "MAX_DIM_16", "WEIGHT_MODES", "STORAGE_SUFFIX"]

#: kernel weight modes (template W of mgg_csr_rows): per-edge array, 1 * row factor, column factor
WEIGHT_MODES = {"weighted": 0, "one": 1, "column": 2}
_VPL = (1, 2, 4)
MAX_DIM_PADDED = 32 * 4 * _VPL[-1]  # 512 floats
MAX_DIM_16 = 32 * 8 * _VPL[-1]      # 1024 elements of a 16-bit storage dtype (8 per 16-byte vector)
#: kernel name suffix of each storage dtype (mgg_csr_rows{suffix}_l.., mgg_csr_combine{suffix})
STORAGE_SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_fp16"}
#: default entries per warp task of a hub row (rows longer than this are split)
DEFAULT_CHUNK = 2048
#: lane counts of the one-vector layouts whose default short-row mapping is "bundles" (any
#: one-vector layout runs them when asked: row_mapping="bundles"). One H200, products-like
#: (bench/results/2026-11-26-h200x1-064c5d3, c6/c7): D = 64 (16 lanes) 4.34 ms against 4.60
#: packed (gcn); D = 16 (4 lanes) 1.79 against 1.92. Reddit-like D = 16 loses 2% (0.944 against
#: 0.927). The 16-bit layouts (bench/results/2026-11-26-h200x1-555af30, c6): bf16 D = 64 (8
#: lanes) products-like gcn 2.690 against 2.890 packed, sum 2.354 against 2.498, reddit-like
#: 1-3% faster; bf16 D = 16 (2 lanes) products-like gcn 1.696 against 1.863, sum 1.417 against
#: 1.480; reddit-like loses 1-2% there, where `bundles_pay` keeps its rows packed. float32 at
#: D = 5..8 (2 lanes) and 17..32 (8 lanes) takes the same rule without its own timing.
BUNDLE_LANES = (2, 4, 8, 16)
#: short-row mappings: "packed" (one row per lane group, rows by degree), "bundles" (runs of
#: consecutive rows per lane group, walked as one entry stream; layouts of one vector per lane),
#: "scan" (runs of consecutive rows per warp, row ends by a segmented scan: mgg_csr_scan; rows of
#: at most 8 quads of 4 columns, float32 or 16-bit, a quad a lane on SCAN_LANES lanes; other layouts
#: take the "default" mapping) or "default" (scan for the layouts of SCAN_DEFAULT_LANES lanes; else
#: bundles for the one-vector layouts of BUNDLE_LANES lanes where they pay on the CSR,
#: bundles_pay; else packed)
ROW_MAPPINGS = ("default", "packed", "bundles", "scan")
#: lane counts (one quad of 4 columns a lane: a float4, or 8 bytes of 16-bit storage) that have
#: mgg_csr_scan kernels (D = 5..32; 16-bit D <= 8 runs 2 lanes)
SCAN_LANES = (2, 4, 8)
#: ... and those whose "default" mapping is scan, where bundles would pay
#: (`bundles_pay`: short rows of a few entries). One H200, against the bundles they replace
#: (bench/results/2026-11-27-h200x1-b6415bd, c3; each call's best source
#: segment count): products-like D = 16 sum 1.249 against 1.421 ms, gcn 1.547 against 1.706; D = 8
#: 0.792 / 0.983 against 1.071 / 1.362. Reddit-like keeps its packed rows (bundles do not pay
#: there): scan took 0.94-1.00x of them. D = 17..32 (8 lanes): 0.97-0.99x of bundles, so not there.
#: 16-bit storage takes the same rule on its lanes of quads (D <= 16): one H200, products-like,
#: bf16 (bench/results/2026-11-27-h200x1-97b2a66 c10): D = 16 gcn 1.088 against 1.552 ms in
#: bundles, sum 0.942 against 1.175; D = 8 0.644 / 0.598 against 1.365 / 1.007.
SCAN_DEFAULT_LANES: tuple[int, ...] = (2, 4)
#: entries (plus rows) a scan run aims at (a warp's run of consecutive short rows): 1024 against
#: 512 on products-like D = 16 (c3): 1.249 / 1.270 ms sum, 1.547 / 1.573 gcn; 2048 and 4096 were
#: slower
DEFAULT_SCAN_RUN = 1024
#: rows with more entries than this are long tasks under the scan mapping (whole warps, split at
#: `chunk`); the others are in runs. 256 (the bundles' threshold at D = 16) against 1024 on
#: products-like D = 16 (c3): 1.249 / 1.264 ms sum, 1.547 / 1.557 gcn in two segments
SCAN_LONG_THRESHOLD = 256
#: warps per block of mgg_csr_scan (SCAN_WPB in local_csr.cu: its shared memory is static)
SCAN_WPB = 4
#: batches of K entries a bundle aims at (its entries: about K * this, plus its last row's tail)
DEFAULT_BUNDLE_BATCHES = 8
#: bundle order: 0 = all runs by size (most entries first); w > 0 = windows of w runs in row order,
#: by size inside (bundle_rows). One H200, products-like, gcn: 8192 keeps D = 64 at the by-size
#: time (4.339 against 4.340 ms) and takes D = 16 from 70% to 71-72% of the gather floor; pure
#: row order was 9% slower at D = 64 (c6, c7)
DEFAULT_BUNDLE_WINDOW = 8192
#: column-mode weights (gcn; mean transposed) with float32 storage: True scales the table once
#: (x' = cf x, mgg_csr_scale_rows) and runs w = 1; False reads cf[src] per edge in the kernel.
#: One H200, gcn, default knobs (bench/results/2026-11-26-h200x1-ae8f2a8/c1): products-like D = 16
#: 1.637 ms scaled against 1.978 per edge, reddit-like D = 16 0.922 against 1.555, even with cf
#: loaded a batch after its index and shuffled after the row loads (tried there, not kept)
PRESCALE_COLUMN = True
#: the scan kernel reads a call's row factor packed with the row ends (pack_row_ends) instead of
#: loading it a window (in ncu those loads all missed the L2). One H200 each,
#: products-like (bench/results/2026-11-27-h200x1-a28b5e5): gcn on a producer-scaled table D = 16
#: 1.197 against 1.243 ms (c1), 1.03-1.04x (c2, c8), D = 8 1.04-1.06x; with the pre-scale pass
#: 1.04-1.05x and 1.04-1.09x; sum (no rf) unchanged
PACK_ROW_FACTOR = True
#: in source segments the scan kernel adds a row's self term in the pass of the segment that holds
#: its source row (whose gathers bring x[t] into the L2), not all in the first pass: gcn on a
#: producer-scaled table, D = 16, 1.07x (c2) and 1.02x (c8) over rf packed alone; with the
#: pre-scale pass and at D = 8 0.93-1.09x, within what these machines move between reps
SELF_IN_SEGMENT = True
#: where the self weight of the scaled form equals the row factor (GCN: diag / cf = rf), the scan
#: runs take it from the packed row ends instead of loading diag ...
SELF_FROM_RF = True
#: ... at this many lanes or more: products-like on a producer-scaled table, D = 16 (4 lanes)
#: 1.01-1.06x, D = 8 (2 lanes) 0.93-0.97x (bench/results/2026-11-27-h200x1-a28b5e5 c2, c8)
SELF_FROM_RF_MIN_LANES = 4
#: rows past any row index: the whole range of a self term
ALL_ROWS = 1 << 62
#: float4s a thread of mgg_csr_scale_rows loads before it stores them (SCALE_UNROLL in local_csr.cu)
SCALE_UNROLL = 4
TABLE16_UNROLL = 4  # 8-value vectors a thread of mgg_csr_table16 (TABLE16_UNROLL in local_csr.cu)
#: the storage dtypes whose factored gcn calls (`takes_scaled_input`) run on a table scaled by cf.
#: Not fp16: there f * grad rounds to fp16 below its normal range (6e-5) on large graphs, and
#: products-like GCN (one H200, bench/results/2026-11-27-h200x1-e7cb465 c3) validated at 0.8639
#: with the fold against 0.8786 without it; bf16 (float32's range) read 0.8788 both ways.
SCALED_INPUT_STORAGE = (torch.float32, torch.bfloat16)
#: warps per block of the row kernels: 4 beat 8 by 3-5 % at D = 16 and 64 on reddit-like and
#: products-like (one H200, bench/local_csr.py, every mapping)
DEFAULT_WPB = 4


def _check_row_knobs(row_mapping: str | None, bundle_batches: int | None, bundle_window: int | None = None,
                     source_segments: int | None = None, scan_run: int | None = None) -> None:
    """ValueError naming the knob for a bad row mapping, bundle size, segment count or scan run
    size (None: not given)."""
    if scan_run is not None and not (isinstance(scan_run, (int, np.integer)) and not isinstance(scan_run, bool)
                                     and scan_run >= 1):
        raise ValueError(f"csr_rows: scan_run must be an integer >= 1 (entries), got {scan_run!r}")
    if source_segments is not None and not (isinstance(source_segments, (int, np.integer))
                                            and not isinstance(source_segments, bool) and 1 <= source_segments <= 64):
        raise ValueError(f"csr_rows: source_segments must be an integer in [1, 64] or None (automatic), "
                         f"got {source_segments!r}")
    if row_mapping is not None and row_mapping not in ROW_MAPPINGS:
        raise ValueError(f"csr_rows: row_mapping must be one of {ROW_MAPPINGS}, got {row_mapping!r}")
    if bundle_batches is not None and bundle_batches < 1:
        raise ValueError(f"csr_rows: bundle_batches must be >= 1, got {bundle_batches}")
    if bundle_window is not None and bundle_window < 0:
        raise ValueError(f"csr_rows: bundle_window must be >= 0, got {bundle_window}")


def entries_per_batch(lanes: int) -> int:
    """K, the entries a lane group of `lanes` lanes takes per batch (Geo<L>::K in the kernels)."""
    return lanes * (1 if lanes >= 8 else 8 // lanes)


def lanes_for_width(dim_padded: int) -> tuple[int, int]:
    """(L lanes per group, V float4 columns per lane) of the kernel for rows of dim_padded floats."""
    if dim_padded < 4 or dim_padded % 4:
        raise ValueError(f"padded width must be a positive multiple of 4, got {dim_padded}")
    return lane_layout(dim_padded, max_vpl=_VPL[-1], who="the csr_rows kernels'")


def default_long_threshold(groups: int) -> int:
    """Rows with more entries than this get whole warps (others are packed `groups` per warp)."""
    return min(32 * groups, 256)


def bundles_pay(indptr, long_threshold: int, target: int) -> bool:
    """Whether bundles of `target` entries would hold two or more short rows on average: the
    mean degree of the rows with at most `long_threshold` entries is <= target / 2 (indptr: int64
    [n + 1], numpy or a tensor on any device). Where they would not, a bundle is about one row,
    and rows packed by degree balance a warp's lane groups better: one H200, reddit-like D = 16
    (short rows of 110 entries on average) 0.927 ms packed against 0.944 in bundles of 64;
    products-like (22 on average) 1.79 in bundles against 1.92 packed."""
    ip = indptr if isinstance(indptr, torch.Tensor) else torch.from_numpy(np.asarray(indptr, np.int64))
    deg = ip[1:] - ip[:-1]
    short = deg[deg <= long_threshold]
    return bool(short.numel()) and 2 * float(short.sum()) <= target * short.numel()


# -------------------------------------------------------------------------------------------------
@dataclass
class RowSchedule:
    """Row -> warp mapping of mgg_csr_rows for one CSR and one lane-group count G.

    Arrays are numpy, or tensors on the GPU where the schedule was built from a CUDA indptr.
    long_tasks: int64 [n_long, 4] (row, start, end, slot), longest first; slot -1 writes out[row],
        slot >= 0 writes partial[slot] (a chunk of a split row).
    short_rows: int32 [n_short], rows packed G per warp, by degree descending (isolated rows last);
        empty when `bundles` is used instead.
    split: int64 [n_split, 3] (row, first slot, slots) of the rows split over several tasks.
    bundles: None, or int64 [n_bundles, 2] (r0, r1): runs of consecutive short rows, one per lane
        group, G per warp, by work (entries + rows) descending (`bundle_rows`); they cover every
        short row.
    """

    groups: int
    long_threshold: int
    chunk: int
    long_tasks: np.ndarray | torch.Tensor
    short_rows: np.ndarray | torch.Tensor
    split: np.ndarray | torch.Tensor
    num_slots: int
    seconds: float = 0.0
    bundles: np.ndarray | torch.Tensor | None = None

    @property
    def num_warps(self) -> int:
        return len(self.long_tasks) + -(-self.num_items // self.groups)

    @property
    def num_items(self) -> int:
        """Short items: bundles (runs) where there are, else packed rows."""
        return len(self.short_rows) if self.bundles is None else len(self.bundles)


def bundle_rows(indptr: torch.Tensor, is_long: torch.Tensor, target: int, window: int = 0) -> torch.Tensor:
    """int64 [n_bundles, 2] (r0, r1): the rows that are not `is_long`, cut into runs of consecutive
    rows of about `target` units of work, an entry or a row each (a row costs its write and its
    self term even without entries): a new run where a long row intervenes or where the work
    before a row (counted over the short rows only) crosses the next multiple of `target`; sorted
    by work, descending (`window` = 0), or, with `window` = w > 0, in row order by windows of w
    runs and by work, descending, inside each window (the warps running at once then read the
    sources of nearby rows, and a warp's G runs still have about the same size). Every short row
    (empty ones too) is in exactly one run. Counting rows bounds a run of empty rows to `target`
    rows: counting entries alone put all of a degree-sorted graph's empty rows in one run, which
    one lane group walked alone (products-like in degree order, one H200: D = 16 10.4 ms against
    1.45 packed). Torch ops on indptr's device."""
    if target < 1:
        raise ValueError(f"bundle target must be >= 1 entries, got {target}")
    if window < 0:
        raise ValueError(f"bundle window must be >= 0 runs, got {window}")
    dev = indptr.device
    deg = indptr[1:] - indptr[:-1]
    rows = torch.nonzero(~is_long).reshape(-1)
    if rows.numel() == 0:
        return torch.zeros((0, 2), dtype=torch.int64, device=dev)
    work = torch.where(is_long, torch.zeros_like(deg), deg + 1)
    before = (torch.cumsum(work, 0) - work)[rows] // target   # block of each row's first unit
    new = torch.ones(rows.numel(), dtype=torch.bool, device=dev)
    new[1:] = (rows[1:] != rows[:-1] + 1) | (before[1:] != before[:-1])
    first = torch.nonzero(new).reshape(-1)
    last = torch.cat([first[1:] - 1, torch.tensor([rows.numel() - 1], device=dev)])
    r0, r1 = rows[first], rows[last] + 1
    order = torch.argsort((indptr[r0] - indptr[r1]) + (r0 - r1), stable=True)   # most work first
    if window:  # then by window of row order (stable: by work inside a window)
        order = order[torch.argsort(order // window, stable=True)]
    return torch.stack([r0, r1], dim=1)[order].contiguous()


def row_schedule(indptr, groups: int, long_threshold: int | None = None,
                 chunk: int = DEFAULT_CHUNK, skip_empty: bool = False, bundle_target: int = 0,
                 bundle_window: int = 0) -> RowSchedule:
    """The degree-aware mapping of the rows of CSR `indptr` (int64 [n + 1]) for G = `groups`.

    Rows with degree > long_threshold become warp tasks, cut into ceil(deg / chunk) near-equal
    chunks; the others (isolated rows included) are packed G per warp, or, with `bundle_target`
    > 0, cut into runs of consecutive rows of about that much work, an entry or a row each
    (`bundle_rows`), G runs per warp. Torch ops on indptr's device: a numpy indptr gives numpy
    arrays (computed on the CPU), a CUDA tensor gives tensors on its GPU (a sort of the short
    rows by degree, no host round trip). `skip_empty`: rows without entries get no task (a pass that adds to rows
    another pass wrote; not with bundles, which write every row they cover).
    """
    t0 = time.perf_counter()
    if groups not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"groups must be a power of two in [1, 32], got {groups}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if bundle_target and skip_empty:
        raise ValueError("row_schedule: bundles write every row they cover (no skip_empty)")
    thr = default_long_threshold(groups) if long_threshold is None else int(long_threshold)
    if thr < 0:
        raise ValueError(f"long_threshold must be >= 0, got {thr}")
    as_numpy = not isinstance(indptr, torch.Tensor)
    ip = torch.from_numpy(np.ascontiguousarray(indptr, dtype=np.int64)) if as_numpy else indptr.to(torch.int64)
    dev = ip.device
    deg = ip[1:] - ip[:-1]
    is_long = deg > thr
    long_rows = torch.nonzero(is_long).reshape(-1)
    ldeg = deg[long_rows]
    nch = (ldeg + chunk - 1) // chunk
    total = int(nch.sum()) if nch.numel() else 0
    row = torch.repeat_interleave(long_rows, nch, output_size=total)
    first = torch.cumsum(nch, 0) - nch                                   # first task of each long row
    k = torch.arange(total, dtype=torch.int64, device=dev) - torch.repeat_interleave(first, nch, output_size=total)
    rdeg = torch.repeat_interleave(ldeg, nch, output_size=total)
    rn = torch.repeat_interleave(nch, nch, output_size=total)
    # chunk k of a row of d entries in m chunks: [k * d // m, (k + 1) * d // m)
    start = ip[row] + k * rdeg // rn
    end = ip[row] + (k + 1) * rdeg // rn
    is_split = rn > 1
    slot = torch.where(is_split, torch.cumsum(is_split, 0) - 1, -1)
    srow = nch > 1
    split = torch.stack([long_rows[srow], slot[first[srow]], nch[srow]], dim=1) if bool(srow.any()) \
        else torch.zeros((0, 3), dtype=torch.int64, device=dev)
    tasks = torch.stack([row, start, end, slot], dim=1) if total else torch.zeros((0, 4), dtype=torch.int64, device=dev)
    tasks = tasks[torch.argsort(start - end, stable=True)]                # longest first
    bundles = None
    if bundle_target:
        bundles = bundle_rows(ip, is_long, int(bundle_target), int(bundle_window))
        short = torch.zeros(0, dtype=torch.int32, device=dev)
    else:
        short = torch.nonzero(~is_long & (deg > 0) if skip_empty else ~is_long).reshape(-1)
        short = short[torch.argsort(-deg[short], stable=True)].to(torch.int32)  # by degree, descending
    num_slots = int(is_split.sum())
    tasks, short, split = tasks.contiguous(), short.contiguous(), split.contiguous()  # launched by pointer
    if as_numpy:
        tasks, short, split = tasks.numpy(), short.numpy(), split.numpy()
        bundles = None if bundles is None else bundles.numpy()
    return RowSchedule(groups, thr, int(chunk), tasks, short, split, num_slots, time.perf_counter() - t0,
                       bundles)


def visit_order(sched: RowSchedule, indptr: torch.Tensor) -> torch.Tensor:
    """int64 [E] positions of the CSR's entries in the order the row kernel's warps take them:
    the long tasks' ranges (longest first), then the short items (bundles or packed rows) in
    warp order. Benchmarks time a bare gather on this stream too (the graph's locality as this
    kernel sees it), so their gather floor holds for it. Torch ops on indptr's device."""
    ip = indptr.to(torch.int64)
    lt = torch.as_tensor(sched.long_tasks, device=ip.device)
    if sched.bundles is not None:
        b = torch.as_tensor(sched.bundles, device=ip.device)
        starts, ends = ip[b[:, 0]], ip[b[:, 1]]
    else:
        r = torch.as_tensor(sched.short_rows, device=ip.device).long()
        starts, ends = ip[r], ip[r + 1]
    starts = torch.cat([lt[:, 1], starts])
    ends = torch.cat([lt[:, 2], ends])
    lens = ends - starts
    total = int(lens.sum())
    offsets = torch.repeat_interleave(starts - (torch.cumsum(lens, 0) - lens), lens, output_size=total)
    return offsets + torch.arange(total, dtype=torch.int64, device=ip.device)


# -------------------------------------------------------------------------------------------------
@dataclass
class WeightFactors:
    """How the kernel gets edge weights: mode (see WEIGHT_MODES), optional float32 [n] row factor
    rf and column factor cf, and the largest relative deviation from the plan's weights."""

    mode: str
    row: np.ndarray | None = None
    col: np.ndarray | None = None
    max_rel_dev: float = 0.0
    note: str = field(default="")


def _row_blocks(indptr: np.ndarray, block: int = 1 << 23):
    """Yield (r0, r1) row ranges of the CSR holding about `block` entries each."""
    n = len(indptr) - 1
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + block, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        yield r0, r1
        r0 = r1


def _max_rel_dev(indptr, indices, w, rf, cf, device=None, on_device=None) -> float:
    """max |rf[row] * cf[col] - w| / |w| over all entries (float32 [n] factors, None = 1),
    computed in float32 blocks (a plan-time check); on `device` (a CUDA device) with torch,
    reading `on_device` = (indptr, indices, weights) tensors already there when given."""
    if device is not None and torch.device(device).type == "cuda":
        return _max_rel_dev_torch(indptr, indices, w, rf, cf, torch.device(device), on_device=on_device)
    worst = 0.0
    for r0, r1 in _row_blocks(indptr):
        a, b = int(indptr[r0]), int(indptr[r1])
        if a == b:
            continue
        f = (np.repeat(rf[r0:r1], np.diff(indptr[r0: r1 + 1])) if rf is not None
             else np.ones(b - a, np.float32))
        if cf is not None:
            f = f * cf[indices[a:b]]
        ws = w[a:b]
        np.subtract(f, ws, out=f)
        np.abs(f, out=f)
        f /= np.maximum(np.abs(ws), np.float32(1e-30))
        worst = max(worst, float(f.max()))
    return worst


def _max_rel_dev_torch(indptr, indices, w, rf, cf, dev: torch.device, block: int = 1 << 26,
                       on_device=None) -> float:
    """_max_rel_dev with torch on `dev`, in blocks of `block` entries (the same float32 math);
    `on_device`: (indptr int64, indices int32/int64, weights float32) tensors on `dev`, read
    instead of uploading the host arrays block by block."""
    n = len(indptr) - 1
    ip_d, idx_d, w_d = on_device if on_device is not None else (None, None, None)
    ip = ip_d if ip_d is not None else torch.from_numpy(np.ascontiguousarray(indptr, np.int64)).to(dev)
    rf_t = None if rf is None else torch.from_numpy(np.ascontiguousarray(rf, np.float32)).to(dev)
    cf_t = None if cf is None else torch.from_numpy(np.ascontiguousarray(cf, np.float32)).to(dev)
    e = int(indptr[-1])
    worst = torch.zeros((), dtype=torch.float32, device=dev)
    for a in range(0, e, block):
        b = min(e, a + block)
        ws = w_d[a:b] if w_d is not None else torch.from_numpy(np.ascontiguousarray(w[a:b], np.float32)).to(dev)
        f = torch.ones(b - a, dtype=torch.float32, device=dev)
        if rf_t is not None:
            pos = torch.arange(a, b, device=dev)
            row = torch.searchsorted(ip, pos, right=True) - 1
            f = rf_t[row.clamp_(0, n - 1)]
        if cf_t is not None:
            cols = (idx_d[a:b].long() if idx_d is not None
                    else torch.from_numpy(np.ascontiguousarray(indices[a:b], np.int64)).to(dev))
            f = f * cf_t[cols]
        worst = torch.maximum(worst, ((f - ws).abs_() / ws.abs().clamp_min(1e-30)).max())
    return float(worst)


def factor_weights(plan: AggregationPlan, kind: str | None, rtol: float = 2e-6,
                   device=None, on_device=None) -> WeightFactors:
    """The cheapest exact weight mode of `plan`'s local CSR for aggregation `kind`.

    sum: every weight 1 -> "one". mean: weights constant per row (forward, 1/deg_in(target)) ->
    "one" with a row factor; constant per column (transposed, 1/deg_in(column)) -> "column".
    gcn: w = dinv[row] * dinv[col] with dinv recovered from the self weights 1/(deg_in + 1) ->
    "column" with cf = rf = dinv (checked to `rtol`, float32 rounding of the product). Anything
    else, or a plan whose weights do not match: "weighted". The checks run on `device` (CUDA:
    torch, reading `on_device` = (indptr, indices, weights) of the local CSR already uploaded
    there when given; None: numpy on the host).
    """
    ip = np.asarray(plan.local_indptr, np.int64)
    idx = np.asarray(plan.local_indices, np.int64)
    w = np.asarray(plan.local_weight, np.float32)
    n = plan.n_local
    if kind is None:
        return WeightFactors("weighted", note="no kind given")
    if len(w) == 0:
        return WeightFactors("one", note="no edges")
    if kind in UNIT_WEIGHT_KINDS:  # sum_self's diagonal (1) is the plan's self weight
        if bool(np.all(w == 1.0)):
            return WeightFactors("one", note=f"{kind}: w = 1")
    elif kind == "mean":
        deg = np.diff(ip)
        rf = np.zeros(n, np.float32)
        rf[deg > 0] = w[ip[:-1][deg > 0]]
        if _max_rel_dev(ip, idx, w, rf, None, device, on_device) == 0.0:
            return WeightFactors("one", row=rf, note="mean forward: w = rf[row]")
        cf = np.zeros(n, np.float32)
        cf[idx] = w
        if _max_rel_dev(ip, idx, w, None, cf, device, on_device) == 0.0:
            return WeightFactors("column", col=cf, note="mean transposed: w = cf[col]")
    elif kind == "gcn" and plan.has_self:
        sw = np.asarray(plan.self_weight, np.float64)
        if np.all(sw > 0):
            dinv = dinv_from_self_weight(sw)
            dev = _max_rel_dev(ip, idx, w, dinv, dinv, device, on_device)
            if dev <= rtol:
                return WeightFactors("column", row=dinv, col=dinv, max_rel_dev=dev,
                                     note="gcn: w = dinv[row] * dinv[col]")
    return WeightFactors("weighted", note=f"{kind}: weights do not factor, per-edge weights read")


# -------------------------------------------------------------------------------------------------
def _dev(a: np.ndarray | None, dtype, device) -> torch.Tensor | None:
    if a is None:
        return None
    return host_to_device(np.asarray(a), device, dtype)


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def _launch_combine(module, sfx: str, num_sms: int, sched: RowSchedule, partial: torch.Tensor,
                    rf: torch.Tensor | None, diag: torch.Tensor | None, table: torch.Tensor, dv: int,
                    out: torch.Tensor, add: bool, cache: LaunchCache,
                    self_rows: tuple[int, int] = (0, ALL_ROWS)) -> None:
    """mgg_csr_combine{sfx} over `sched`'s split hub rows (none: nothing), inside the caller's
    `cache.stream()`: one warp a split row, 8-warp blocks, at most 8 blocks an SM. The self term
    (diag) goes to the rows in [self_rows[0], self_rows[1]) only."""
    ns = len(sched.split)
    if ns:
        comb = cache.function(module, f"mgg_csr_combine{sfx}")
        cblocks = max(1, min(-(-ns // 8), num_sms * 8))
        comb((cblocks,), (256,), (np.int64(ns), _p(sched.split), _p(partial), _p(rf), _p(diag),
                                  _p(table), np.int32(dv), _p(out), np.int32(add),
                                  np.int64(self_rows[0]), np.int64(self_rows[1])))


def launch_csr_rows(module, sfx: str, lanes: int, vpl: int, mode: int, wpb: int, num_sms: int,
                    sched: RowSchedule, indptr: torch.Tensor, src: torch.Tensor,
                    wt: torch.Tensor | None, cf: torch.Tensor | None, rf: torch.Tensor | None,
                    diag: torch.Tensor | None, table: torch.Tensor, dv: int, out: torch.Tensor,
                    partial: torch.Tensor, add: bool = False, cache: LaunchCache | None = None) -> None:
    """Launch mgg_csr_rows{sfx}_l{lanes}_v{vpl}_w{mode} over one CSR (indptr int64 [n + 1], src
    int32 [E] rows of `table`; the short items are `sched`'s bundles when it has them, else its
    short rows), then mgg_csr_combine{sfx} for its split hub rows, on torch's current stream. `sched`: the CSR's
    RowSchedule for G = 32 / lanes, built from a CUDA indptr (its arrays are contiguous tensors
    on the GPU). `table`: [*, dv] 16-byte vectors in the storage dtype;
    `out`: float32 [n, Dp]; `partial`: float32 [max(slots, 1), Dp]. `add`: add to out's rows
    instead of writing them (a second pass over other columns; see mgg/kernels/local_csr.cu).
    `cache`: the caller's LaunchCache (function handles and stream views kept between calls)."""
    if add and diag is not None:  # the adding pass reuses the self row's registers for out[t]
        raise ValueError("csr_rows: an adding pass (add=True) takes no self term (diag): the first pass adds it")
    cache = cache or LaunchCache()
    with cache.stream():
        warps = sched.num_warps
        if warps:
            runs = sched.bundles is not None
            if runs and vpl != 1:
                raise ValueError(f"csr_rows: bundles need one vector per lane, the layout has {vpl}")
            items = sched.bundles if runs else sched.short_rows
            fn = cache.function(module, f"mgg_csr_rows{sfx}_l{lanes}_v{vpl}_w{mode}")
            fn((-(-warps // wpb),), (32 * wpb,), (
                np.int64(len(sched.long_tasks)), _p(sched.long_tasks), np.int64(len(items)), _p(items),
                np.int32(runs), _p(indptr), _p(src), _p(wt), _p(cf), _p(rf), _p(diag), _p(table), np.int32(dv),
                _p(out), _p(partial), np.int32(add)))
        _launch_combine(module, sfx, num_sms, sched, partial, rf, diag, table, dv, out, add, cache)


def pack_row_ends(indptr: torch.Tensor, rf: torch.Tensor) -> torch.Tensor:
    """int64 [n] for mgg_csr_scan's `ends_rf`: row t's end indptr[t + 1] (< 2^31) in the low 32
    bits, rf[t]'s float32 bits in the high 32, so that a run's row factor comes with its row ends
    instead of one more load a window (indptr int64 [n + 1], rf float32 [n], same device)."""
    if rf.dtype != torch.float32 or rf.shape[0] != indptr.shape[0] - 1:
        raise ValueError(f"pack_row_ends: rf must be float32 [{indptr.shape[0] - 1}], got {rf.dtype} {tuple(rf.shape)}")
    return (rf.contiguous().view(torch.int32).to(torch.int64) << 32) | indptr[1:]


def launch_csr_scan(module, lanes: int, mode: int, num_sms: int, sched: RowSchedule, indptr: torch.Tensor,
                    src: torch.Tensor, wt: torch.Tensor | None, cf: torch.Tensor | None, rf: torch.Tensor | None,
                    diag: torch.Tensor | None, table: torch.Tensor, dv: int, out: torch.Tensor,
                    partial: torch.Tensor, add: bool = False, cache: LaunchCache | None = None,
                    ends_rf: torch.Tensor | None = None, self_rows: tuple[int, int] | None = None,
                    self_rf: bool = False, storage: str = "") -> None:
    """Launch mgg_csr_scan{storage}_l{lanes}_w{mode} over one CSR (a table of dv quads a row: dv
    float4s for float32 storage, storage = ""; dv 8-byte quads of 16-bit values for storage =
    "_bf16" / "_fp16", dv even; lanes in SCAN_LANES, dv <= lanes; out float32 [*, 4 dv]), then
    mgg_csr_combine{storage} for its split hub rows, on torch's current stream. 16-bit storage
    takes mode 1 (w = 1) or 0 (per-edge weights). `sched`: a schedule of one item per warp
    (row_schedule with groups = 1 and bundles: the runs), built from a CUDA indptr. `ends_rf`:
    None, or int64 [n] `pack_row_ends(indptr, rf)` (mode 1 only: the runs then take rf from it;
    `rf` still serves long tasks and split rows).
    `self_rows`: (lo, hi), the rows that get the self term diag * x in this call (None: all);
    an adding pass may take one. `self_rf`: the runs take the self weight to be the row factor
    from `ends_rf` (diag = rf, GCN's scaled form) instead of loading diag. Other arguments as
    launch_csr_rows."""
    if lanes not in SCAN_LANES or dv > lanes:
        raise ValueError(f"csr_rows: the scan mapping takes {SCAN_LANES} lanes of one quad, got "
                         f"{lanes} lanes for {dv} quads")
    if storage not in ("", "_bf16", "_fp16"):
        raise ValueError(f"csr_rows: no scan kernel for storage {storage!r}")
    if storage and (dv % 2 or mode == WEIGHT_MODES["column"]):
        raise ValueError(f"csr_rows: the 16-bit scan kernels take rows of whole 16-byte vectors (an even number "
                         f"of quads, got {dv}) and w = 1 or per-edge weights (got mode {mode})")
    if sched.groups != 1 or sched.bundles is None:
        raise ValueError("csr_rows: the scan kernel takes a schedule of runs, one a warp")
    if ends_rf is not None and (mode != WEIGHT_MODES["one"] or rf is None
                                or ends_rf.dtype != torch.int64 or ends_rf.shape[0] != indptr.shape[0] - 1):
        raise ValueError(f"csr_rows: ends_rf (packed row ends) needs mode 1 with rf, int64 [{indptr.shape[0] - 1}]; "
                         f"got mode {mode}, {ends_rf.dtype} {tuple(ends_rf.shape)}")
    if self_rf and (ends_rf is None or diag is None):
        raise ValueError("csr_rows: self_rf (the self weight is the row factor) needs ends_rf and diag")
    lo, hi = (0, ALL_ROWS) if self_rows is None else (int(self_rows[0]), int(self_rows[1]))
    align = 4 * max(1, 8 // lanes)  # a lane loads its 8 / lanes indices (weights) of a window as one vector
    for name, a in (("src", src), ("wt", wt)):
        if a is not None and a.data_ptr() % align:
            raise ValueError(f"csr_rows: the scan kernel reads {name} in {align}-byte vectors at {lanes} lanes; "
                             f"its start must be {align}-byte aligned (a tensor of its own, not an offset view)")
    cache = cache or LaunchCache()
    with cache.stream():
        warps = sched.num_warps
        if warps:
            fn = cache.function(module, f"mgg_csr_scan{storage}_l{lanes}_w{mode}")
            fn((-(-warps // SCAN_WPB),), (32 * SCAN_WPB,), (
                np.int64(len(sched.long_tasks)), _p(sched.long_tasks), np.int64(len(sched.bundles)),
                _p(sched.bundles), _p(indptr), _p(src), _p(wt), _p(cf), _p(rf), _p(diag), _p(table),
                np.int32(dv), _p(out), _p(partial), np.int32(add), _p(ends_rf), np.int64(lo), np.int64(hi),
                np.int32(self_rf)))
        _launch_combine(module, storage, num_sms, sched, partial, rf, diag, table, dv // 2 if storage else dv, out,
                        add, cache, (lo, hi))


class CsrRowsExecutor:
    """Runs `out = W x + diag * x` for one plan with no remote work, with mgg_csr_rows.

    Args:
        plan: an AggregationPlan with num_remote_edges == 0.
        store: the symmetric store (unused at P = 1; may be None).
        kind: the aggregation kind of the plan ("sum", "mean", "gcn", "sum_self") or None; picks the weight mode
            (see factor_weights).
        wpb: warps per block of the rows kernel.
        long_threshold / chunk: row schedule knobs (see row_schedule); None = defaults.
        row_mapping: how short rows map to lane groups (ROW_MAPPINGS): "packed", "bundles"
            (layouts of one vector per lane; wider ones run packed), "scan" (runs of rows a
            warp, mgg_csr_scan: a quad of 4 columns a lane, float32 or 16-bit, on SCAN_LANES
            lanes; other layouts as "default"), or "default" (scan for SCAN_DEFAULT_LANES; bundles
            for the layouts of BUNDLE_LANES lanes and one vector where `bundles_pay`; packed
            elsewhere).
        scan_run: with the scan mapping, the entries (plus rows) a warp's run aims at.
        bundle_batches: with bundles, the batches of K entries a bundle aims at.
        bundle_window: with bundles, 0 (sorted by size) or the window of runs sorted by size
            inside, in row order between windows (see bundle_rows).
        local_part: aggregate the plan's local CSR only, whatever its remote edges (the first
            pass of mgg.kernels.halo_csr.HaloCsrExecutor, through `aggregate_local`).
        source_segments: run the CSR as this many passes over contiguous source ranges (the
            first writes, the others add; see mgg/kernels/source_segments.py), or None: per
            width, `auto_source_segments` of the table's bytes and the GPU's L2.

    Attributes:
        storage_dtype: the element type the kernels read x in (float32, bfloat16, float16): x is
            rounded to it (in the symmetric slice when world_size > 1, else a private buffer).
        poison: when True, the output and partial buffers are NaN-filled before the kernels run.
        factors: the WeightFactors in use; prep_seconds: host preparation time (weights check and
            every row schedule built so far).
        prescale / can_prescale: whether a column-mode call (gcn; mean transposed) with float32
            storage scales the table once (x' = cf x) and runs w = 1 (default where possible).
        column_by_weights: a column-mode plan with 16-bit storage runs its plain calls on the
            plan's per-edge weights (mode "weighted") instead of cf[src] per edge.
        column_scalable: a column-mode plan whose factored calls (`takes_scaled_input`) run w = 1
            on a table scaled by cf, in float32 and bf16 storage (SCALED_INPUT_STORAGE; bf16:
            cf * x rounded once).
    """

    def __init__(self, plan: AggregationPlan, store=None, kind: str | None = None, *, wpb: int = DEFAULT_WPB,
                 long_threshold: int | None = None, chunk: int = DEFAULT_CHUNK,
                 storage_dtype: torch.dtype = torch.float32, local_part: bool = False,
                 row_mapping: str = "default", bundle_batches: int = DEFAULT_BUNDLE_BATCHES,
                 bundle_window: int = DEFAULT_BUNDLE_WINDOW, source_segments: int | None = None,
                 scan_run: int = DEFAULT_SCAN_RUN):
        _check_row_knobs(row_mapping, bundle_batches, bundle_window, source_segments, scan_run)
        self.scan_run = int(scan_run)
        if storage_dtype not in STORAGE_SUFFIX:
            raise ValueError(f"csr_rows: storage dtype must be one of {list(STORAGE_SUFFIX)}, got {storage_dtype}")
        self.storage_dtype = storage_dtype
        if plan.num_remote_edges and not local_part:
            raise ValueError(f"csr_rows: rank {plan.rank}'s plan has {plan.num_remote_edges} remote edges; "
                             f"this kernel aggregates local rows only (use GPUExecutor)")
        if not 1 <= wpb <= 32:
            raise ValueError(f"csr_rows: wpb must be in [1, 32], got {wpb}")
        if plan.num_local_edges >= 2**31 or plan.n_local >= 2**31:
            raise ValueError(f"csr_rows: {plan.num_local_edges} edges / {plan.n_local} rows exceed int32 indices")
        t0 = time.perf_counter()
        self.plan, self.store, self.kind, self.wpb = plan, store, kind, wpb
        self.long_threshold, self.chunk = long_threshold, chunk
        self.row_mapping, self.bundle_batches = row_mapping, int(bundle_batches)
        self.bundle_window = int(bundle_window)
        self.source_segments = None if source_segments is None else int(source_segments)
        self._segments: dict[int, list[SourceSegment]] = {}
        self._ends_rf: dict[tuple[int, int], torch.Tensor] = {}  # (segments, k) -> pack_row_ends
        #: the scan kernel's options, settable to compare: rf packed with the row ends
        #: (PACK_ROW_FACTOR), the self term in its source segment's pass (SELF_IN_SEGMENT), the
        #: self weight from the packed rf where it equals it (SELF_FROM_RF)
        self.pack_row_factor = PACK_ROW_FACTOR
        self.self_in_segment = SELF_IN_SEGMENT
        self.self_from_rf = SELF_FROM_RF
        self.poison = False
        dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.indptr = _dev(plan.local_indptr, np.int64, dev)
        self.src = _dev(plan.local_indices, np.int32, dev)
        wt = _dev(plan.local_weight, np.float32, dev)  # kept only when the kernel reads it
        self.factors = factor_weights(plan, kind, device=dev, on_device=(self.indptr, self.src, wt))
        self.prep_seconds = time.perf_counter() - t0
        self._schedules: dict[int, RowSchedule] = {}
        self._pays: dict[int, bool] = {}  # groups -> bundles_pay, for the "default" mapping
        f = self.factors
        # A plain 16-bit call cannot take the pre-scale below (its rows are x rounded; x' would
        # round to 16 bits a second time; factored calls differ: see column_scalable), and there
        # cf[src] per edge (a dependent load per entry) lost to the plan's per-edge weight
        # stream: one H200, gcn, bf16 (bench/results/2026-11-26-h200x1-3f22b5d, c2), products-like
        # D = 16 1.718 against 1.920 ms, D = 64 2.792 against 3.312; reddit-like D = 16 1.009
        # against 1.612, D = 64 1.947 against 2.473. So column kinds read the weights there.
        self.column_by_weights = f.mode == "column" and storage_dtype != torch.float32
        self.wt = wt if (f.mode == "weighted" or self.column_by_weights) else None
        self.rf = _dev(f.row, np.float32, dev)
        self.cf = _dev(f.col, np.float32, dev)
        self.diag = _dev(plan.self_weight, np.float32, dev) if plan.has_self else None
        # Column weights w_j = cf[src_j] cost a dependent gather per edge: on reddit-like (D = 16,
        # gcn, one H100) 1.92 ms against 1.14 ms for w = 1. With float32 storage the call instead
        # scales the table once, x' = cf * x (an n x D pass), and runs mode "one":
        #     rf[t] sum_j cf[s_j] x[s_j] + diag[t] x[t] = rf[t] sum_j x'[s_j] + (diag[t] / cf[t]) x'[t]
        # (16-bit storage cannot: x' would round to 16 bits a second time; see column_by_weights.)
        # A table scaled by cf (by the producer: `scaled_input`; or by a factored call itself) runs
        # w = 1 in float32 and bf16 storage: bf16 then rounds the scaled row, cf * x, once.
        self.column_scalable = (f.mode == "column" and storage_dtype in SCALED_INPUT_STORAGE
                                and self.cf is not None and self.cf.shape[0] == plan.n_local
                                and (self.diag is None or (self.diag.shape[0] == plan.n_local
                                                           and bool((self.cf > 0).all()))))
        self.can_prescale = self.column_scalable and storage_dtype == torch.float32
        self.diag_prescaled = self.diag / self.cf if self.column_scalable and self.diag is not None else None
        self.default_prescale = self.can_prescale and PRESCALE_COLUMN
        self._prescale = self.default_prescale
        self._diag_no_rf: torch.Tensor | None = None  # diag_prescaled / rf, on the first call without rf
        # GCN's scaled self weight diag / cf is its row factor (up to rounding): then the scan runs
        # can take it from the packed row ends
        self.self_is_rf = (self.diag_prescaled is not None and self.rf is not None
                           and self.rf.shape == self.diag_prescaled.shape
                           and bool(torch.allclose(self.diag_prescaled, self.rf, rtol=1e-6, atol=0.0)))
        from .build import load_module

        self.module = load_module("local_csr", nvshmem=False, device=dev.index)
        self.launch_cache = LaunchCache(device=dev)
        props = torch.cuda.get_device_properties(dev)
        self.num_sms = props.multi_processor_count
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0))

    @property
    def prescale(self) -> bool:
        """Whether a column-mode call scales the table once (x' = cf x, then w = 1) instead of
        reading cf[src] per edge in the kernel; settable (to compare the two) where `can_prescale`."""
        return self._prescale

    @prescale.setter
    def prescale(self, on: bool) -> None:
        if on and not self.can_prescale:
            raise ValueError(f"csr_rows: this plan's weights (mode {self.factors.mode}, storage "
                             f"{self.storage_dtype}) cannot run on a table scaled by a column factor")
        self._prescale = bool(on)

    @property
    def takes_scaled_input(self) -> bool:
        """Whether calls may pass `scaled_input=True` / `row_factor=False` (a column-mode plan with
        a row factor, in float32 or bf16 storage). At world_size > 1 such a call writes cf * x
        into this rank's symmetric slice, so every rank's kernels must read scaled rows in that
        call: DistGraph makes the choice the same on every rank (takes_scaled_input)."""
        return self.column_scalable and self.rf is not None

    def quads(self, vectors: int) -> int:
        """The quads of 4 columns (the scan kernel's unit: a lane, a row's DV) in `vectors` 16-byte
        vectors of this storage: as many for float32, twice as many for 16-bit (8 columns a vector)."""
        return vectors if self.storage_dtype == torch.float32 else 2 * vectors

    def uses_scan(self, lanes: int, vpl: int) -> bool:
        """Whether the layout (lanes, vectors per lane) runs the scan kernel: one vector a lane,
        its quads (a lane each) in SCAN_LANES, and the mapping "scan" (or "default" for
        SCAN_DEFAULT_LANES where bundles would pay on this CSR: short rows of a few entries)."""
        if vpl != 1 or self.quads(lanes) not in SCAN_LANES:
            return False
        if self.row_mapping == "scan":
            return True
        return (self.row_mapping == "default" and self.quads(lanes) in SCAN_DEFAULT_LANES
                and self._bundles_pay(lanes))

    def _bundles_pay(self, lanes: int) -> bool:
        """bundles_pay for this CSR at the layout's group count and bundle size (cached)."""
        groups = 32 // lanes
        if groups not in self._pays:
            thr = default_long_threshold(groups) if self.long_threshold is None else int(self.long_threshold)
            self._pays[groups] = bundles_pay(self.indptr, thr, self.bundle_batches * entries_per_batch(lanes))
        return self._pays[groups]

    def short_mapping(self, lanes: int, vpl: int) -> str:
        """The mapping the layout's short rows run in: "scan", "bundles" or "packed"."""
        if self.uses_scan(lanes, vpl):
            return "scan"
        return "bundles" if self.uses_bundles(lanes, vpl) else "packed"

    def uses_bundles(self, lanes: int, vpl: int) -> bool:
        """Whether the layout (lanes, vectors per lane) runs its short rows in bundles (in
        mgg_csr_rows): with "default" or "scan" where the layout has no scan kernel, where the
        layout is in BUNDLE_LANES and bundles pay on this CSR (`bundles_pay`)."""
        if vpl != 1 or self.row_mapping == "packed" or self.uses_scan(lanes, vpl):
            return False
        if self.row_mapping == "bundles":
            return True
        if lanes not in BUNDLE_LANES:
            return False
        return self._bundles_pay(lanes)

    def schedule(self, groups: int, mapping: str = "packed",
                 segment: tuple[int, int] | None = None) -> RowSchedule:
        """The (cached) row schedule for lane-group count `groups` and short-row `mapping`
        (short_mapping's names): "packed" rows; "bundles" of about bundle_batches * K entries;
        "scan" runs of about scan_run entries, one a warp, rows above SCAN_LONG_THRESHOLD (or the
        long_threshold knob) as long tasks. Built once on the GPU. `segment` = (k, S): the
        schedule of source segment k of S (`segments`); None: the whole CSR."""
        key = (groups, mapping, segment)
        if key not in self._schedules:
            ip = self.indptr if segment is None else self.segments(segment[1])[segment[0]].indptr
            if mapping == "scan":
                thr = SCAN_LONG_THRESHOLD if self.long_threshold is None else self.long_threshold
                s = row_schedule(ip, 1, thr, self.chunk, bundle_target=self.scan_run, bundle_window=0)
            else:
                target = self.bundle_batches * entries_per_batch(32 // groups) if mapping == "bundles" else 0
                s = row_schedule(ip, groups, self.long_threshold, self.chunk,
                                 bundle_target=target, bundle_window=self.bundle_window)  # on the GPU
            self.prep_seconds += s.seconds
            self._schedules[key] = s
        return self._schedules[key]

    def segments_for(self, dim: int) -> int:
        """Source segments a call at width `dim` runs in: the `source_segments` knob, or where it
        is None, auto_source_segments of this plan's table at that width (MAX_AUTO_SEGMENTS_SCAN
        on the scan kernel; MAX_AUTO_SEGMENTS_SCAN_16 on it for 16-bit storage, from
        AUTO_MIN_TABLE_L2_SCAN_16 L2s of table)."""
        if self.source_segments is not None:
            return self.source_segments
        dv, _, lanes, vpl = self._layout(dim)
        if vpl != 1 or not self.plan.num_local_edges:
            return 1
        table = self.plan.n_local * dv * 16
        most, min_l2 = MAX_AUTO_SEGMENTS, None
        if self.uses_scan(lanes, vpl):
            most = MAX_AUTO_SEGMENTS_SCAN
            if self.storage_dtype != torch.float32:
                most, min_l2 = MAX_AUTO_SEGMENTS_SCAN_16, AUTO_MIN_TABLE_L2_SCAN_16
        return auto_source_segments(table, self.l2_bytes, self.plan.num_local_edges / max(self.plan.n_local, 1), most,
                                    min_l2)

    def segments(self, count: int) -> list[SourceSegment]:
        """The local CSR cut into `count` source segments (cached; built on the GPU)."""
        if count not in self._segments:
            t0 = time.perf_counter()
            self._segments[count] = split_by_source(self.indptr, self.src, self.wt, self.plan.n_local, count)
            self.prep_seconds += time.perf_counter() - t0
        return self._segments[count]

    def visit_order(self, dim: int) -> torch.Tensor:
        """int64 [E] positions of the local CSR's entries in the order this executor's kernels
        take them at width `dim` with the current knobs (see `visit_order`; with source segments,
        segment by segment)."""
        _, _, lanes, vpl = self._layout(dim)
        mapping = self.short_mapping(lanes, vpl)
        count = self.segments_for(dim)
        if count == 1:
            return visit_order(self.schedule(32 // lanes, mapping), self.indptr)
        order = source_segment_order(self.src, self.plan.n_local, count)
        parts, start = [], 0
        for k, seg in enumerate(self.segments(count)):
            pos = order[start:start + seg.num_entries]
            start += seg.num_entries
            parts.append(pos[visit_order(self.schedule(32 // lanes, mapping, (k, count)), seg.indptr)])
        return torch.cat(parts)

    def retune(self, wpb: int | None = None, long_threshold: int | None = None, chunk: int | None = None,
               row_mapping: str | None = None, bundle_batches: int | None = None,
               bundle_window: int | None = None, source_segments: int | None | str = "keep",
               scan_run: int | None = None) -> None:
        """Change the launch / schedule knobs (benchmarks and tuners); schedules are rebuilt lazily.
        source_segments: a count, None (automatic) or "keep" (unchanged)."""
        if scan_run is not None:
            _check_row_knobs(None, None, None, None, scan_run)
            self.scan_run = int(scan_run)
            self._schedules.clear()
        if source_segments != "keep":
            _check_row_knobs(None, None, None, source_segments)
            self.source_segments = None if source_segments is None else int(source_segments)
        _check_row_knobs(row_mapping, bundle_batches, bundle_window)
        if bundle_window is not None:
            self.bundle_window = int(bundle_window)
            self._schedules.clear()
        if row_mapping is not None:
            self.row_mapping = row_mapping
        if bundle_batches is not None:
            self.bundle_batches = int(bundle_batches)
            self._schedules.clear()
            self._pays.clear()
        if wpb is not None:
            if not 1 <= wpb <= 32:
                raise ValueError(f"csr_rows: wpb must be in [1, 32], got {wpb}")
            self.wpb = wpb
        if (long_threshold, chunk) != (None, None):
            self.long_threshold = long_threshold if long_threshold is not None else self.long_threshold
            self.chunk = chunk if chunk is not None else self.chunk
            self._schedules.clear()
            self._pays.clear()

    def _buf(self, rows: int, dp: int) -> torch.Tensor:
        if self.poison:
            return torch.full((rows, dp), float("nan"), dtype=torch.float32, device=self.device)
        return torch.empty((rows, dp), dtype=torch.float32, device=self.device)

    def _layout(self, dim: int) -> tuple[int, int, int, int]:
        """(dv 16-byte vectors per stored row, stored row width in elements, lanes, vectors per
        lane) of a width-`dim` embedding in the storage dtype."""
        if self.storage_dtype == torch.float32:
            dp = max(4, -(-dim // 4) * 4)
            lanes, vpl = lanes_for_width(dp)
            return dp // 4, dp, lanes, vpl
        if dim > MAX_DIM_16:
            raise ValueError(f"csr_rows: embedding width {dim} is above the 16-bit kernels' limit of {MAX_DIM_16}")
        dv = max(1, -(-dim // 8))
        lanes, vpl = lane_layout(4 * dv, max_vpl=_VPL[-1])  # the same lane layout over 16-byte vectors
        return dv, 8 * dv, lanes, vpl

    def _table(self, x: torch.Tensor, sym, dim: int, dp: int, scale: torch.Tensor | None = None) -> torch.Tensor:
        """x as the kernels read it: [n, dp] rows in the storage dtype, 16-byte aligned. `scale`
        (16-bit storage at world_size 1 only): float32 [n], the table holds scale * x, rounded
        to the storage dtype once (one pass, as the plain table: `_table16`)."""
        p = self.plan
        if self.storage_dtype != torch.float32:
            if p.world_size > 1:  # my slice, as other ranks read it
                if sym.dtype != self.storage_dtype or sym.dim_padded != dp:
                    raise ValueError(f"csr_rows: symmetric array is {sym.dtype} [*, {sym.dim_padded}], "
                                     f"expected {self.storage_dtype} [*, {dp}]")
                return sym.padded
            xin = torch.empty((p.n_local, dp), dtype=self.storage_dtype, device=self.device)
            if p.n_local:
                self._table16(x, xin, scale)
            return xin
        if dp == dim and x.is_contiguous() and x.data_ptr() % 16 == 0:
            return x
        xin = torch.zeros((p.n_local, dp), dtype=torch.float32, device=self.device)
        xin[:, :dim] = x
        return xin

    def __call__(self, x: torch.Tensor, sym=None, scaled_input: bool = False, row_factor: bool = True) -> torch.Tensor:
        """x: float32 [n_local, D] on this GPU (D <= 512; 1024 with 16-bit storage); sym: the
        symmetric array of width D (in the storage dtype), written and published (collective)
        only when world_size > 1, so that other ranks can read this rank's rows. Returns float32
        [n_local, D]: W x' + diag * x' with x' = x rounded to the storage dtype.

        Where `takes_scaled_input` (W = diag(rf) A diag(cf), diag = rf * cf * d):
        scaled_input: x already holds cf * x (the op that produced x applied the column factor),
        so the pre-scale pass is skipped; row_factor=False: the output without its row factor,
        A (cf x) + (d cf) x (the backward of a call on a scaled input)."""
        if (scaled_input or not row_factor) and not self.takes_scaled_input:
            raise ValueError(f"csr_rows: this plan (kind {self.kind}, weights {self.factors.mode}, storage "
                             f"{self.storage_dtype}, {self.plan.world_size} ranks) takes no scaled input")
        self._check_x(x)
        self._layout(int(x.shape[1]))  # a width the kernels cannot take fails before any collective
        if self.plan.world_size > 1:
            if sym is None:
                raise ValueError("csr_rows: world_size > 1 needs the symmetric array (other ranks read x from it)")
            if not scaled_input and not row_factor:  # the slice other ranks read holds cf * x
                x, scaled_input = self.cf.unsqueeze(1) * x, True
            sym.write(x)
            sym.publish()
        out = self.aggregate_local(x, sym, scaled_input, row_factor)
        if self.plan.world_size > 1:
            sym.release()
        dim = int(x.shape[1])
        return out if out.shape[1] == dim else out[:, :dim].contiguous()

    def _check_x(self, x: torch.Tensor) -> None:
        n = self.plan.n_local
        if x.dim() != 2 or x.shape[0] != n or x.dtype != torch.float32 or not x.is_cuda:
            raise ValueError(f"csr_rows: expected float32 CUDA x of shape [{n}, D], got "
                             f"{x.dtype} {tuple(x.shape)} on {x.device}")

    def _table16(self, x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None) -> None:
        """out (16-bit [n, dp], contiguous, dp a multiple of 8) = round16(scale * x) (x float32
        [n, D], D <= dp; scale float32 [n] or None), its padding zero, with mgg_csr_table16 on
        torch's current stream: one pass (a zero fill and torch's copy were two; torch's
        broadcast multiply into a 16-bit view ran unvectorised)."""
        x = x.contiguous()
        n, dim = int(x.shape[0]), int(x.shape[1])
        dv = int(out.shape[1]) // 8
        blocks = max(1, -(-(n * dv) // (TABLE16_UNROLL * 256)))
        vec4 = int(dim % 4 == 0 and x.data_ptr() % 16 == 0)
        fn = self.launch_cache.function(self.module, "mgg_csr_table16" + STORAGE_SUFFIX[self.storage_dtype])
        with self.launch_cache.stream():
            fn((blocks,), (256,), (np.int64(n), np.int32(dim), np.int32(dv), np.int32(vec4), _p(scale), _p(x),
                                   _p(out)))

    def _scale_rows(self, table: torch.Tensor, dv: int) -> torch.Tensor:
        """cf * table (float32 [n, 4 * dv], contiguous) with mgg_csr_scale_rows, on torch's
        current stream: a new float32 [n, 4 * dv] tensor."""
        out = torch.empty_like(table)
        total = table.shape[0] * dv
        blocks = max(1, -(-total // (SCALE_UNROLL * 256)))  # one block per 1024 float4s (see the kernel)
        shift = dv.bit_length() - 1 if dv & (dv - 1) == 0 else -1
        fn = self.launch_cache.function(self.module, "mgg_csr_scale_rows")
        with self.launch_cache.stream():
            fn((blocks,), (256,), (np.int64(table.shape[0]), np.int32(dv), np.int32(shift), _p(self.cf),
                                   _p(table), _p(out)))
        return out

    def aggregate_local(self, x: torch.Tensor, sym=None, scaled_input: bool = False,
                        row_factor: bool = True) -> torch.Tensor:
        """The local CSR's part, W_local x' + diag * x', on torch's current stream, touching no
        other rank (with 16-bit storage at world_size > 1, x' is read from `sym`, which must
        hold x already). Returns float32 [n_local, Dp] (Dp = D padded, see `_layout`).
        scaled_input / row_factor: see __call__ (callers check `takes_scaled_input`)."""
        n = self.plan.n_local
        dim = int(x.shape[1])
        dv, dp, lanes, vpl = self._layout(dim)
        groups = 32 // lanes
        sixteen = self.storage_dtype != torch.float32
        factored = scaled_input or not row_factor
        # a factored call on an unscaled 16-bit x scales it in the copy that rounds it (cf x, rounded once)
        xin = self._table(x, sym, dim, dp, self.cf if factored and sixteen and not scaled_input else None)
        width = 4 * self.quads(dv)  # float32 output row: 4 columns a quad
        out = self._buf(n, width)
        mapping = self.short_mapping(lanes, vpl)
        count = self.segments_for(dim) if n else 1
        if count == 1:
            parts = [(self.schedule(groups, mapping), self.indptr, self.src, self.wt)]
        else:
            parts = [(self.schedule(groups, mapping, (k, count)), seg.indptr, seg.src, seg.wt)
                     for k, seg in enumerate(self.segments(count))]
        partial = self._buf(max(max(p[0].num_slots for p in parts), 1), width)
        mode, diag, cf, rf = WEIGHT_MODES[self.factors.mode], self.diag, self.cf, self.rf
        if factored or (self.prescale and n):  # x' = cf * x, then w = 1 (see __init__)
            if n and not scaled_input and not sixteen:
                xin = self._scale_rows(xin, dv)
            mode, diag = WEIGHT_MODES["one"], self.diag_prescaled
            if not row_factor:  # rf (sum + (diag / (cf rf)) x') without rf
                if self._diag_no_rf is None and diag is not None:
                    self._diag_no_rf = diag / rf
                rf, diag = None, self._diag_no_rf
        elif self.column_by_weights:  # w = the plan's weight per edge (rf[t] cf[s] in one number)
            mode, cf, rf = WEIGHT_MODES["weighted"], None, None
        if n:  # segment k > 0 adds to the rows the passes before it wrote; the first adds the self term
            for k, (sched, indptr, src, wt) in enumerate(parts):
                if mapping == "scan":
                    ends_rf = None
                    if rf is not None and mode == WEIGHT_MODES["one"] and self.pack_row_factor:
                        if (count, k) not in self._ends_rf:
                            self._ends_rf[(count, k)] = pack_row_ends(indptr, rf)
                        ends_rf = self._ends_rf[(count, k)]
                    if count > 1 and diag is not None and self.self_in_segment:
                        seg = self.segments(count)[k]  # rows whose source row this pass gathers
                        d, rows = diag, (seg.lo, seg.hi)
                    else:
                        d, rows = (diag if k == 0 else None), None
                    self_rf = (d is not None and ends_rf is not None and d is self.diag_prescaled
                               and self.self_is_rf and self.self_from_rf and lanes >= SELF_FROM_RF_MIN_LANES)
                    launch_csr_scan(self.module, self.quads(lanes), mode, self.num_sms, sched, indptr, src,
                                    wt, cf, rf, d, xin, self.quads(dv), out, partial, add=k > 0,
                                    cache=self.launch_cache, ends_rf=ends_rf, self_rows=rows, self_rf=self_rf,
                                    storage=STORAGE_SUFFIX[self.storage_dtype])
                else:
                    launch_csr_rows(self.module, STORAGE_SUFFIX[self.storage_dtype], lanes, vpl, mode, self.wpb,
                                    self.num_sms, sched, indptr, src, wt, cf, rf,
                                    diag if k == 0 else None, xin, dv, out, partial, add=k > 0,
                                    cache=self.launch_cache)
        return out
