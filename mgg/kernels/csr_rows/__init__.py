"""csr_rows: single-GPU aggregation from the plan's local CSR, the launchers of mgg/kernels/local_csr.cu.

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
sums, partials and the output are float32 (docs/storage-dtype.m

Modules, by job:

    schedule    the row -> warp mappings (packed rows, bundles, scan runs; hub rows split) and
                their knobs' defaults
    weights     the weight factorisation (factor_weights: one / column / weighted)
    launchers   the kernels' launch ABI (launch_csr_rows, launch_csr_scan, the scale and 16-bit
                table passes), lane layouts and width limits
    executor    CsrRowsExecutor: a plan's device arrays (or a SourceCsr given instead), its
                schedules and source segments, and the choice of kernel, weight form and passes
                per call
    source_csr  SourceCsr: a CSR on the GPU over a table of own rows then other rows (the
                fused halo pass of mgg.kernels.halo_csr)
"""
from .executor import SCALED_INPUT_STORAGE, SELF_FROM_RF_MIN_LANES, CsrRowsExecutor
from .source_csr import SourceCsr
from ..variants import CSR_ROWS_MAX_DIM_PADDED, MAX_DIM_16
from .launchers import (ALL_ROWS, DEFAULT_WPB, SCAN_WPB, STORAGE_SUFFIX, launch_csr_rows,
                        launch_csr_scan, lanes_for_width, pack_row_ends)
from .schedule import (BUNDLE_LANES, DEFAULT_BUNDLE_BATCHES, DEFAULT_BUNDLE_WINDOW, DEFAULT_CHUNK, DEFAULT_SCAN_RUN,
                       ROW_MAPPINGS, SCAN_DEFAULT_LANES, SCAN_LANES, SCAN_LONG_THRESHOLD, RowSchedule, bundle_rows,
                       bundles_pay, check_row_knobs, default_long_threshold, entries_per_batch, row_schedule,
                       visit_order)
from .weights import WEIGHT_MODES, WeightFactors, factor_weights

__all__ = ["CsrRowsExecutor", "SourceCsr", "SCALED_INPUT_STORAGE", "SELF_FROM_RF_MIN_LANES",
           "launch_csr_rows", "launch_csr_scan", "pack_row_ends", "lanes_for_width", "ALL_ROWS", "DEFAULT_WPB",
           "CSR_ROWS_MAX_DIM_PADDED", "MAX_DIM_16", "SCAN_WPB", "STORAGE_SUFFIX",
           "RowSchedule", "row_schedule", "bundle_rows", "bundles_pay", "visit_order", "entries_per_batch",
           "default_long_threshold", "check_row_knobs", "BUNDLE_LANES", "ROW_MAPPINGS", "SCAN_LANES",
           "SCAN_DEFAULT_LANES", "DEFAULT_SCAN_RUN", "SCAN_LONG_THRESHOLD", "DEFAULT_BUNDLE_BATCHES",
           "DEFAULT_BUNDLE_WINDOW", "DEFAULT_CHUNK",
           "WeightFactors", "factor_weights", "WEIGHT_MODES"]
