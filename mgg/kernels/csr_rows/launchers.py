"""The launch ABI of the csr_rows kernels (mgg/kernels/local_csr.cu): names, grids, arguments.

`launch_csr_rows` runs mgg_csr_rows (packed rows or bundles) and `launch_csr_scan` runs
mgg_csr_scan (runs of rows a warp), each followed by mgg_csr_combine for the split hub rows;
`launch_scale_rows` and `launch_table16` are the one-pass table preparations (x' = cf x in
float32; 16-bit rows rounded once). Every launch goes on torch's current stream through the
caller's LaunchCache. Also here: the lane layouts of a row width and the width limits.
"""
from __future__ import annotations

import numpy as np
import torch

from ..streams import LaunchCache
from ..variants import CSR_ROWS_MAX_VPL, lane_layout
from .schedule import SCAN_LANES, RowSchedule
from .weights import WEIGHT_MODES

#: kernel name suffix of each storage dtype (mgg_csr_rows{suffix}_l.., mgg_csr_combine{suffix})
STORAGE_SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_fp16"}
#: warps per block of mgg_csr_scan (SCAN_WPB in local_csr.cu: its shared memory is static)
SCAN_WPB = 4
#: rows past any row index: the whole range of a self term
ALL_ROWS = 1 << 62
#: float4s a thread of mgg_csr_scale_rows loads before it stores them (SCALE_UNROLL in local_csr.cu)
SCALE_UNROLL = 4
TABLE16_UNROLL = 4  # 8-value vectors a thread of mgg_csr_table16 (TABLE16_UNROLL in local_csr.cu)
#: warps per block of the row kernels: 4 beat 8 by 3-5 % at D = 16 and 64 on reddit-like and
#: products-like (one H200, bench/local_csr.py, every mapping)
DEFAULT_WPB = 4


def lanes_for_width(dim_padded: int) -> tuple[int, int]:
    """(L lanes per group, V float4 columns per lane) of the kernel for rows of dim_padded floats."""
    if dim_padded < 4 or dim_padded % 4:
        raise ValueError(f"padded width must be a positive multiple of 4, got {dim_padded}")
    return lane_layout(dim_padded, max_vpl=CSR_ROWS_MAX_VPL, who="the csr_rows kernels'")


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


def launch_table16(module, cache: LaunchCache, suffix: str, x: torch.Tensor, out: torch.Tensor,
                   scale: torch.Tensor | None) -> None:
    """out (16-bit [n, dp], contiguous, dp a multiple of 8) = round16(scale * x) (x float32
    [n, D], D <= dp; scale float32 [n] or None), its padding zero, with mgg_csr_table16{suffix}
    on torch's current stream: one pass (a zero fill and torch's copy were two; torch's
    broadcast multiply into a 16-bit view ran unvectorised)."""
    x = x.contiguous()
    n, dim = int(x.shape[0]), int(x.shape[1])
    dv = int(out.shape[1]) // 8
    blocks = max(1, -(-(n * dv) // (TABLE16_UNROLL * 256)))
    vec4 = int(dim % 4 == 0 and x.data_ptr() % 16 == 0)
    fn = cache.function(module, "mgg_csr_table16" + suffix)
    with cache.stream():
        fn((blocks,), (256,), (np.int64(n), np.int32(dim), np.int32(dv), np.int32(vec4), _p(scale), _p(x),
                               _p(out)))


def launch_scale_rows(module, cache: LaunchCache, cf: torch.Tensor, table: torch.Tensor, dv: int) -> torch.Tensor:
    """cf * table (cf float32 [n]; table float32 [n, 4 * dv], contiguous) with mgg_csr_scale_rows,
    on torch's current stream: a new float32 [n, 4 * dv] tensor."""
    out = torch.empty_like(table)
    total = table.shape[0] * dv
    blocks = max(1, -(-total // (SCALE_UNROLL * 256)))  # one block per 1024 float4s (see the kernel)
    shift = dv.bit_length() - 1 if dv & (dv - 1) == 0 else -1
    fn = cache.function(module, "mgg_csr_scale_rows")
    with cache.stream():
        fn((blocks,), (256,), (np.int64(table.shape[0]), np.int32(dv), np.int32(shift), _p(cf),
                               _p(table), _p(out)))
    return out
