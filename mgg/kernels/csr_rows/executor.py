"""CsrRowsExecutor: `out = W x + diag * x` over a plan's local CSR with the csr_rows kernels.

The executor holds the plan's device arrays (CSR, weight factors, self weights), builds its row
schedules and source segments lazily (on the GPU; their time is `prep_seconds`), and per call
picks the layout of the width, the short-row mapping, the weight form (per-edge weights, factors,
or a table scaled by the column factor) and the passes (source segments), then launches them.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ...runtime.plan import AggregationPlan
from ...runtime.transfer import host_to_device
from ..source_segments import (AUTO_MIN_TABLE_L2_SCAN_16, MAX_AUTO_SEGMENTS, MAX_AUTO_SEGMENTS_SCAN,
                               MAX_AUTO_SEGMENTS_SCAN_16, SourceSegment, auto_source_segments, source_segment_order,
                               split_by_source)
from ..streams import LaunchCache
from ..variants import MAX_DIM_16, MAX_VPL_16, lane_layout
from .launchers import (DEFAULT_WPB, STORAGE_SUFFIX, launch_csr_rows, launch_csr_scan,
                        launch_scale_rows, launch_table16, lanes_for_width, pack_row_ends)
from .schedule import (BUNDLE_LANES, DEFAULT_BUNDLE_BATCHES, DEFAULT_BUNDLE_WINDOW, DEFAULT_CHUNK, DEFAULT_SCAN_RUN,
                       SCAN_DEFAULT_LANES, SCAN_LANES, SCAN_LONG_THRESHOLD, RowSchedule, bundles_pay,
                       check_row_knobs, default_long_threshold, entries_per_batch, row_schedule, visit_order)
from .source_csr import SourceCsr
from .weights import WEIGHT_MODES, factor_weights

__all__ = ["CsrRowsExecutor", "SourceCsr", "SCALED_INPUT_STORAGE", "SELF_FROM_RF_MIN_LANES"]

#: the scan runs take GCN's self weight from the packed row factor (where the scaled self weight
#: equals it) at this many lanes or more: products-like on a producer-scaled table, D = 16
#: (4 lanes) 1.01-1.06x, D = 8 (2 lanes) 0.93-0.97x (bench/results/2026-11-27-h200x1-a28b5e5 c2, c8)
SELF_FROM_RF_MIN_LANES = 4
#: the storage dtypes whose factored gcn calls (`takes_scaled_input`) run on a table scaled by cf.
#: Not fp16: there f * grad rounds to fp16 below its normal range (6e-5) on large graphs, and
#: products-like GCN (one H200, bench/results/2026-11-27-h200x1-e7cb465 c3) validated at 0.8639
#: with the fold against 0.8786 without it; bf16 (float32's range) read 0.8788 both ways.
SCALED_INPUT_STORAGE = (torch.float32, torch.bfloat16)


def _dev(a: np.ndarray | None, dtype, device) -> torch.Tensor | None:
    if a is None:
        return None
    return host_to_device(np.asarray(a), device, dtype)


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
        csr: a SourceCsr to run instead of the plan's local CSR (its rows are the plan's, its
            columns index a table of csr.n_src rows passed to `aggregate_local`).

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
                 scan_run: int = DEFAULT_SCAN_RUN, csr: SourceCsr | None = None):
        check_row_knobs(row_mapping, bundle_batches, bundle_window, source_segments, scan_run)
        self.scan_run = int(scan_run)
        if storage_dtype not in STORAGE_SUFFIX:
            raise ValueError(f"csr_rows: storage dtype must be one of {list(STORAGE_SUFFIX)}, got {storage_dtype}")
        self.storage_dtype = storage_dtype
        if plan.num_remote_edges and not local_part and csr is None:
            raise ValueError(f"csr_rows: rank {plan.rank}'s plan has {plan.num_remote_edges} remote edges; "
                             f"this kernel aggregates local rows only (use GPUExecutor)")
        if not 1 <= wpb <= 32:
            raise ValueError(f"csr_rows: wpb must be in [1, 32], got {wpb}")
        #: rows of the table the kernels read (own rows first) and entries of the CSR they run
        self.n_src = plan.n_local if csr is None else int(csr.n_src)
        self.num_edges = plan.num_local_edges if csr is None else int(csr.src.shape[0])
        if self.num_edges >= 2**31 or self.n_src >= 2**31:
            raise ValueError(f"csr_rows: {self.num_edges} edges / {self.n_src} table rows exceed int32 indices")
        t0 = time.perf_counter()
        self.plan, self.store, self.kind, self.wpb = plan, store, kind, wpb
        self.long_threshold, self.chunk = long_threshold, chunk
        self.row_mapping, self.bundle_batches = row_mapping, int(bundle_batches)
        self.bundle_window = int(bundle_window)
        self.source_segments = None if source_segments is None else int(source_segments)
        self._segments: dict[int, list[SourceSegment]] = {}
        self._ends_rf: dict[tuple[int, int], torch.Tensor] = {}  # (segments, k) -> pack_row_ends
        self.poison = False
        dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        if csr is None:
            self.indptr = _dev(plan.local_indptr, np.int64, dev)
            self.src = _dev(plan.local_indices, np.int32, dev)
            wt = _dev(plan.local_weight, np.float32, dev)  # kept only when the kernel reads it
            self.factors = factor_weights(plan, kind, device=dev, on_device=(self.indptr, self.src, wt))
        else:
            self.indptr, self.src, wt, self.factors = csr.indptr, csr.src, csr.weight, csr.factors
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
                                and self.cf is not None and self.cf.shape[0] == self.n_src
                                and (self.diag is None or (self.diag.shape[0] == plan.n_local
                                                           and bool((self.cf > 0).all()))))
        self.can_prescale = self.column_scalable and storage_dtype == torch.float32
        self.diag_prescaled = (self.diag / self.cf[:plan.n_local] if self.column_scalable and self.diag is not None
                               else None)
        # Scaling once beats reading cf[src] per edge. One H200, gcn, default knobs
        # (bench/results/2026-11-26-h200x1-ae8f2a8/c1): products-like D = 16 1.637 ms scaled against
        # 1.978 per edge, reddit-like D = 16 0.922 against 1.555.
        self.default_prescale = self.can_prescale
        self._prescale = self.default_prescale
        self._diag_no_rf: torch.Tensor | None = None  # diag_prescaled / rf, on the first call without rf
        # GCN's scaled self weight diag / cf is its row factor (up to rounding): then the scan runs
        # can take it from the packed row ends
        self.self_is_rf = (self.diag_prescaled is not None and self.rf is not None
                           and self.rf.shape == self.diag_prescaled.shape
                           and bool(torch.allclose(self.diag_prescaled, self.rf, rtol=1e-6, atol=0.0)))
        from ..build import load_module

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
        if vpl != 1 or not self.num_edges:
            return 1
        table = self.n_src * dv * 16
        most, min_l2 = MAX_AUTO_SEGMENTS, None
        if self.uses_scan(lanes, vpl):
            most = MAX_AUTO_SEGMENTS_SCAN
            if self.storage_dtype != torch.float32:
                most, min_l2 = MAX_AUTO_SEGMENTS_SCAN_16, AUTO_MIN_TABLE_L2_SCAN_16
        return auto_source_segments(table, self.l2_bytes, self.num_edges / max(self.plan.n_local, 1), most,
                                    min_l2)

    def segments(self, count: int) -> list[SourceSegment]:
        """The local CSR cut into `count` source segments (cached; built on the GPU)."""
        if count not in self._segments:
            t0 = time.perf_counter()
            self._segments[count] = split_by_source(self.indptr, self.src, self.wt, self.n_src, count)
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
        order = source_segment_order(self.src, self.n_src, count)
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
            check_row_knobs(None, None, None, None, scan_run)
            self.scan_run = int(scan_run)
            self._schedules.clear()
        if source_segments != "keep":
            check_row_knobs(None, None, None, source_segments)
            self.source_segments = None if source_segments is None else int(source_segments)
        check_row_knobs(row_mapping, bundle_batches, bundle_window)
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
        lanes, vpl = lane_layout(4 * dv, max_vpl=MAX_VPL_16)  # the same lane layout over 16-byte vectors
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
        """out (16-bit [n, dp]) = round16(scale * x) in one pass (launch_table16), in this
        executor's storage dtype, on torch's current stream."""
        launch_table16(self.module, self.launch_cache, STORAGE_SUFFIX[self.storage_dtype], x, out, scale)

    def _scale_rows(self, table: torch.Tensor, dv: int) -> torch.Tensor:
        """cf * table (float32 [n, 4 * dv], contiguous) in one pass (launch_scale_rows), on
        torch's current stream: a new float32 [n, 4 * dv] tensor."""
        return launch_scale_rows(self.module, self.launch_cache, self.cf, table, dv)

    def aggregate_local(self, x: torch.Tensor, sym=None, scaled_input: bool = False,
                        row_factor: bool = True, table: torch.Tensor | None = None) -> torch.Tensor:
        """The local CSR's part, W_local x' + diag * x', on torch's current stream, touching no
        other rank (with 16-bit storage at world_size > 1, x' is read from `sym`, which must
        hold x already). Returns float32 [n_local, Dp] (Dp = D padded, see `_layout`).
        scaled_input / row_factor: see __call__ (callers check `takes_scaled_input`).
        table: the rows the kernels read, [n_src, Dp] in the storage dtype (own rows first, as
        written: scaled by cf when `scaled_input`), instead of x (which then gives the width only)."""
        n = self.plan.n_local
        dim = int(x.shape[1])
        dv, dp, lanes, vpl = self._layout(dim)
        groups = 32 // lanes
        sixteen = self.storage_dtype != torch.float32
        factored = scaled_input or not row_factor
        # a factored call on an unscaled 16-bit x scales it in the copy that rounds it (cf x, rounded once)
        if table is not None:
            xin = table
        else:
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
                    # The scan runs read the row factor packed with the row ends (pack_row_ends)
                    # rather than loading it a window (those loads all missed the L2): products-like
                    # gcn on a producer-scaled table, D = 16 1.197 against 1.243 ms
                    # (bench/results/2026-11-27-h200x1-a28b5e5 c1). In source segments a row's self
                    # term is added in the pass of the segment that holds its source row (whose
                    # gathers bring x[t] into the L2): 1.02-1.07x there (c2, c8).
                    ends_rf = None
                    if rf is not None and mode == WEIGHT_MODES["one"]:
                        if (count, k) not in self._ends_rf:
                            self._ends_rf[(count, k)] = pack_row_ends(indptr, rf)
                        ends_rf = self._ends_rf[(count, k)]
                    if count > 1 and diag is not None:
                        seg = self.segments(count)[k]  # rows whose source row this pass gathers
                        d, rows = diag, (seg.lo, seg.hi)
                    else:
                        d, rows = (diag if k == 0 else None), None
                    self_rf = (d is not None and ends_rf is not None and d is self.diag_prescaled
                               and self.self_is_rf and lanes >= SELF_FROM_RF_MIN_LANES)
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
