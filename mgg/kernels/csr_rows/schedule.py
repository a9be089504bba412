"""Row schedules of the csr_rows kernels: which warp (or lane group) takes which rows.

Rows longer than a threshold are warp tasks, split into chunks where they are hubs (the chunks'
partial sums combined by a second pass); the short rows are packed a lane group each by degree
("packed"), cut into runs of consecutive rows walked as one entry stream ("bundles"), or into runs
of a warp each whose row ends a segmented scan finds ("scan"). Schedules are built with torch ops
on the indptr's device (the GPU in the executor). The defaults of the schedule knobs are here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

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
#: batches of K entries a bundle aims at (its entries: about K * this, plus its last row's tail)
DEFAULT_BUNDLE_BATCHES = 8
#: bundle order: 0 = all runs by size (most entries first); w > 0 = windows of w runs in row order,
#: by size inside (bundle_rows). One H200, products-like, gcn: 8192 keeps D = 64 at the by-size
#: time (4.339 against 4.340 ms) and takes D = 16 from 70% to 71-72% of the gather floor; pure
#: row order was 9% slower at D = 64 (c6, c7)
DEFAULT_BUNDLE_WINDOW = 8192


def check_row_knobs(row_mapping: str | None, bundle_batches: int | None, bundle_window: int | None = None,
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

