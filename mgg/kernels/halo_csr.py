"""Remote work beside local work on the degree-aware CSR kernels: the `halo_csr` variant.

`HaloCsrExecutor(plan, store, kind)` runs `out = W x + diag * x` for a plan with remote work
(P > 1) on this rank's GPU (collective), in one of two forms.

Fused (`fused`; by default for wide rows and a halo buffer of an L2 or more, `uses_fused`): x goes into this PE's symmetric slice, which is published; one
`mgg_halo_gather_rows` launch copies this rank's own rows and every unique remote row the plan
reads into a private table [n + H, Dp] (own rows first, halo slot h at row n + h; each row scaled
by its column factor where the GCN table is prescaled); one `mgg_csr_rows` pass then runs the
joined CSR (mgg/kernels/fused_rows.py: each row's local entries, then its remote entries at
columns n + h) over that table and writes every row once. Then release.

Two passes (`fused = False`; by default for narrow rows or a small halo buffer), in four steps:

  1. x goes into this PE's symmetric slice, which is published (other ranks read it).
  2. `mgg_halo_gather_rows` (mgg/kernels/aggregate.cu) copies every unique remote row the plan
     reads, once, into a private halo buffer [H, Dp] (nvshmem_ptr loads over NVLink; several
     narrow rows per warp), each row multiplied by its column factor when the GCN table is
     prescaled (below); with `overlap` on a high-priority side stream.
  3. `mgg_csr_rows` aggregates the local CSR on the current stream (`CsrRowsExecutor.
     aggregate_local`: every row written once, self term included), beside the gather when
     `overlap` is on.
  4. The current stream waits for the gather; `mgg_csr_rows` then aggregates the remote CSR,
     whose columns are halo slots (`plan.remote_slot`), and *adds* each row's sum to the row the
     local pass wrote (`add = 1`; rows without remote entries get no task). Then release.

So each remote row crosses NVLink once (as in `halo`), and the passes are the atomics-free row
kernels of `csr_rows` instead of the partition kernels. The fused form reads each row's whole
neighbourhood in one task (a row split over the two passes pays its setup, its hub chunks and
its output twice) but waits for the barrier and the gather before its pass; the two-pass form
runs the local pass beside them. That overlap pays for narrow rows, whose gather waits on NVLink
latency more than it moves bytes, and for a halo buffer inside the L2; for wide rows and a large
halo the gather and the local pass contend for the same memory and the fused pass wins.
`python -m mgg.train` at P = 4 on 4x H200 (L2 50 MB), two passes / fused, ms an epoch
(bench/results/2026-11-28-h200x4-71eded6, member c11/): products-like GIN (64-wide rows, halo
315 MB a rank) 26.77 / 22.48; products-like GCN (16-wide, halo 79 MB) 2.49 / 2.64; reddit-like
GCN (16-wide, 11 MB) 1.65 / 1.70, GIN (64-wide, 45 MB) 9.59 / 9.78. So the default is fused for
rows of FUSED_MIN_VECTORS 16-byte vectors or more and a halo buffer of FUSED_MIN_HALO_L2 L2s or
more: products-like GIN 23.7 ms, reddit-like GIN 9.56 (member c14/). By default (`overlap`) the publish barrier
and the gather run on a high-priority side stream while the local pass runs on the current stream:
the local pass reads only this rank's rows, so it waits neither for the slowest rank nor for
NVLink.

Weights (as in `csr_rows`): the local CSR's factorisation (`factor_weights`) carries over to the
remote CSR when its weights agree, checked entry by entry once (`remote_factors`): sum (w = 1),
mean forward (w = rf[row]), gcn (w = dinv[row] * cf[slot], cf derived from the weights), mean
transposed (w = cf[slot]); otherwise per-edge weights. With float32 storage and column factors
the gather scales the halo rows, so the remote pass reads no per-edge factor either.

A table scaled by its producer (gcn, `scaled_input=True` / `row_factor=False`, float32 or bf16:
`takes_scaled_input`): every rank's slice then holds cf * x (rounded once in bf16), the gather
copies rows unchanged and both passes run w = 1 -- no pre-scale pass, no per-edge weight.
DistGraph makes that choice on every rank alike, since a rank's slice is read by the others.
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.plan import AggregationPlan
from .csr_rows import (CSR_ROWS_MAX_DIM_PADDED, DEFAULT_CHUNK, STORAGE_SUFFIX, WEIGHT_MODES, CsrRowsExecutor, RowSchedule,
                       WeightFactors, launch_csr_rows, row_schedule, DEFAULT_WPB)
from .fused_rows import fused_csr

__all__ = ["HaloCsrExecutor", "remote_factors", "FUSED_DEFAULT", "FUSED_MIN_VECTORS", "FUSED_MIN_HALO_L2"]

#: the default form of a HaloCsrExecutor: None (by the halo buffer's size, `uses_fused`), True
#: (fused: one pass over [own | halo] rows) or False (the two passes)
FUSED_DEFAULT: bool | None = None
#: the auto form is fused where the call's rows are this many 16-byte vectors or more (64 float32) ...
FUSED_MIN_VECTORS = 16
#: ... and its halo buffer (H rows as stored) is this many L2s or more
FUSED_MIN_HALO_L2 = 1

#: rows per block of the gather: 8 warps
_GATHER_WPB = 8
#: rows in flight per lane group of the gather (GATHER_ILP in aggregate.cu)
_GATHER_ILP = 8
#: the gather's default grid: blocks an SM (the hardware keeps 8 of its 256-thread blocks resident).
#: Fewer blocks leave warp slots to the local pass beside it, but the two share L2 and the
#: owners' memory, and a smaller gather is a slower one: products-like GCN at P = 4 (4x H200,
#: bench/results/2026-11-28-h200x4-71eded6, member c7/): 2.69 / 2.66 / 2.54 / 2.51 ms an epoch at 1 / 2 / 4 / 16.
GATHER_BLOCKS_PER_SM = 16


def _dev(a: np.ndarray, dtype, device) -> torch.Tensor:
    from ..runtime.transfer import host_to_device

    return host_to_device(np.asarray(a), device, dtype)


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def remote_factors(plan: AggregationPlan, local: WeightFactors, indptr: torch.Tensor, slot: torch.Tensor,
                   weight: torch.Tensor, rtol: float = 2e-6) -> WeightFactors:
    """The weight mode of the plan's remote CSR (rows: targets, columns: halo slots) given the
    local CSR's factors `local`, checked against every remote weight (on the tensors' device).

    "one" (w = 1, or w = rf[row] with rf taken from each row's first remote entry) when the
    local mode is "one" and every remote weight matches it exactly; "column" (w = rf[row] * cf[slot], cf float32 [H] derived from the weights) when the
    local mode is "column" and the product reproduces every weight to `rtol`; else "weighted".
    Args: indptr int64 [n + 1], slot int32/int64 [Er], weight float32 [Er] of the remote CSR.
    """
    er, h, n = int(weight.numel()), int(plan.halo_size), plan.n_local
    if er == 0:
        return WeightFactors("one", row=local.row, note="no remote edges")
    if local.mode not in ("one", "column"):
        return WeightFactors("weighted", note=f"local weights: {local.mode}")
    dev = weight.device
    row = torch.repeat_interleave(torch.arange(n, device=dev), indptr[1:] - indptr[:-1], output_size=er)
    if local.mode == "one":  # sum (w = 1) or mean forward (w = 1 / deg_in(row), constant per row)
        if local.row is None:
            if bool((weight == 1).all()):
                return WeightFactors("one", note="remote weights = 1")
            return WeightFactors("weighted", note="remote weights are not 1")
        # the row factor from the remote entries themselves: a row with no local entry has none
        deg = indptr[1:] - indptr[:-1]
        rf = torch.zeros(n, dtype=torch.float32, device=dev)
        has = deg > 0
        rf[has] = weight[indptr[:-1][has]]
        if bool((rf[row] == weight).all()):
            return WeightFactors("one", row=rf.cpu().numpy(), note="remote weights = rf[row]")
        return WeightFactors("weighted", note="remote weights are not constant per row")
    f = (torch.from_numpy(np.ascontiguousarray(local.row, np.float32)).to(dev)[row] if local.row is not None
         else torch.ones(er, dtype=torch.float32, device=dev))
    if bool((f <= 0).any()):
        return WeightFactors("weighted", note="a row factor is not positive")
    cf = torch.zeros(h, dtype=torch.float32, device=dev)
    cf[slot.long()] = weight / f  # any entry of a slot gives its factor; all are checked below
    dev_max = float(((f * cf[slot.long()] - weight).abs_() / weight.abs().clamp_min(1e-30)).max())
    if dev_max <= rtol:
        return WeightFactors("column", row=local.row, col=cf.cpu().numpy(), max_rel_dev=dev_max,
                             note="remote weights = rf[row] * cf[slot]")
    return WeightFactors("weighted", max_rel_dev=dev_max, note="remote weights do not factor")


class HaloCsrExecutor:
    """Runs `out = W x + diag * x` for one plan (any remote work): the halo gather and the local
    CSR pass, then the remote CSR pass (see the module docstring).

    Args:
        plan: the rank's AggregationPlan.
        store: the symmetric store (the symmetric array passed to each call lives there).
        kind: the plan's aggregation kind ("sum", "mean", "gcn", "sum_self") or None (per-edge weights).
        wpb / long_threshold / chunk: the row kernels' knobs (CsrRowsExecutor).
        storage_dtype: float32, or bfloat16 / float16 rows (gathered unchanged, float32 sums).

    Attributes:
        fused: True runs the fused form (module docstring), False the two passes, None
            (FUSED_DEFAULT) picks per call by the halo buffer's size (`uses_fused`). Calls with
            `only` run the two passes.
        overlap: (two passes) True (default) runs the publish barrier and the gather on the side stream beside
            the local pass; False runs barrier, gather, local pass and remote pass one after the
            other on the current stream. Two H200s, `python -m mgg.train` GCN with default flags
            at P = 2: reddit-like 2.68 -> 2.63 ms an epoch, products-like 3.81 -> 3.63
            (bench/results/2026-11-28-h200x2-47c293c); products-like at P = 4, 2.78 -> 2.63
            (bench/results/2026-11-28-h200x4-71eded6, member c6/).
        gather_blocks: the gather's grid cap (None: GATHER_BLOCKS_PER_SM blocks an SM).
        poison: NaN-fill the output, partial and halo buffers before the kernels run (tests).
        local: the CsrRowsExecutor of the local part; factors: the remote part's WeightFactors.
        rows: the CsrRowsExecutor that aggregates this rank's rows when `fused` is True (the
            joined CSR's, built on first use), else `local`.

    float32 rows wider than 512 floats go to the `halo` partition kernels (mgg/kernels/gpu.py).
    """

    def __init__(self, plan: AggregationPlan, store=None, kind: str | None = None, *, wpb: int = DEFAULT_WPB,
                 long_threshold: int | None = None, chunk: int = DEFAULT_CHUNK,
                 storage_dtype: torch.dtype = torch.float32):
        if plan.num_remote_edges >= 2**31 or plan.halo_size >= 2**31:
            raise ValueError(f"halo_csr: {plan.num_remote_edges} remote edges / {plan.halo_size} halo rows "
                             f"exceed int32 indices")
        self.local = CsrRowsExecutor(plan, store, kind, wpb=wpb, long_threshold=long_threshold, chunk=chunk,
                                     storage_dtype=storage_dtype, local_part=True)
        self.plan, self.store, self.kind = plan, store, kind
        self.storage_dtype = storage_dtype
        self.fused = FUSED_DEFAULT
        self.overlap = True
        self.gather_blocks: int | None = None
        dev = self.local.device
        self.device = dev
        self.indptr = _dev(plan.remote_indptr, np.int64, dev)
        self.src = _dev(plan.remote_slot, np.int32, dev)
        wt = _dev(plan.remote_weight, np.float32, dev)
        self.factors = remote_factors(plan, self.local.factors, self.indptr, self.src, wt)
        f = self.factors
        self.wt = wt if f.mode == "weighted" else None
        self.rf = self.local.rf if f.row is not None and f.row is self.local.factors.row else _dev_opt(f.row, dev)
        self.cf = _dev_opt(f.col, dev)
        # float32 + column factors: the gather writes cf[h] * x_remote[h], the pass runs w = 1
        self.prescale = f.mode == "column" and storage_dtype == torch.float32 and self.cf is not None
        self.hpe = _dev(plan.halo_pe(), np.int32, dev)
        self.hrow = _dev(plan.halo_row, np.int32, dev)
        self._schedules: dict[int, RowSchedule] = {}
        from .build import load_module

        self.gather_module = load_module("aggregate", device=dev.index)
        self.side = torch.cuda.Stream(dev, priority=-1)
        self._gathered = torch.cuda.Event()
        self.num_sms = self.local.num_sms
        self._wide = None
        self._joined: CsrRowsExecutor | None = None
        self._table_pe = self._table_row = None  # the fused gather's (pe, row) list: own rows, then the halo

    @property
    def takes_scaled_input(self) -> bool:
        """Whether calls may pass `scaled_input=True` / `row_factor=False`: the local part takes
        them (CsrRowsExecutor.takes_scaled_input) and the remote weights factor the same way
        (w = rf[row] * cf[slot], cf the owner's column factor), or there are none."""
        return self.local.takes_scaled_input and (self.factors.mode == "column" or not self.plan.num_remote_edges)

    @property
    def poison(self) -> bool:
        return self.local.poison

    @poison.setter
    def poison(self, value: bool) -> None:
        self.local.poison = bool(value)
        if self._joined is not None:
            self._joined.poison = bool(value)

    @property
    def prep_seconds(self) -> float:
        return self.local.prep_seconds + (self._joined.prep_seconds if self._joined is not None else 0.0)

    @property
    def rows(self) -> CsrRowsExecutor:
        """The executor of this rank's rows when `fused` is True (see the class docstring)."""
        return self.joined if self.fused is True and self.plan.halo_size else self.local

    def uses_fused(self, dim: int) -> bool:
        """Whether a call at width `dim` runs the fused form: `fused` where set; else where the
        stored rows are FUSED_MIN_VECTORS 16-byte vectors or more and this rank's halo buffer, H
        such rows, is FUSED_MIN_HALO_L2 L2s or more. Ranks may differ (each runs one publish and
        one release either way)."""
        if self.fused is not None:
            return bool(self.fused)
        dv = self.local._layout(dim)[0]
        return (dv >= FUSED_MIN_VECTORS
                and self.plan.halo_size * dv * 16 >= FUSED_MIN_HALO_L2 * max(self.local.l2_bytes, 1))

    @property
    def joined(self) -> CsrRowsExecutor:
        """The CsrRowsExecutor of the joined CSR over [own | halo] rows (built on first use, with
        the local executor's knobs; its weights checked entry by entry, mgg.kernels.fused_rows)."""
        if self._joined is None:
            p, loc, dev = self.plan, self.local, self.device
            csr = fused_csr((loc.indptr, loc.src, _dev(p.local_weight, np.float32, dev)), loc.factors,
                            (self.indptr, self.src, _dev(p.remote_weight, np.float32, dev)), self.factors,
                            p.n_local, p.halo_size)
            self._joined = CsrRowsExecutor(p, self.store, self.kind, wpb=loc.wpb, long_threshold=loc.long_threshold,
                                           chunk=loc.chunk, storage_dtype=self.storage_dtype,
                                           row_mapping=loc.row_mapping, bundle_batches=loc.bundle_batches,
                                           bundle_window=loc.bundle_window, source_segments=loc.source_segments,
                                           scan_run=loc.scan_run, csr=csr)
            self._joined.poison = self.poison
            me = np.full(p.n_local, p.rank, np.int32)
            self._table_pe = torch.cat([_dev(me, np.int32, dev), self.hpe])
            self._table_row = torch.cat([torch.arange(p.n_local, dtype=torch.int32, device=dev), self.hrow])
        return self._joined

    def schedule(self, groups: int) -> RowSchedule:
        """The remote CSR's row schedule for `groups` lane groups (rows with remote entries only)."""
        if groups not in self._schedules:
            self._schedules[groups] = row_schedule(self.indptr, groups, self.local.long_threshold, self.local.chunk,
                                                   skip_empty=True)
        return self._schedules[groups]

    def retune(self, wpb: int | None = None, long_threshold: int | None = None, chunk: int | None = None) -> None:
        """The row kernels' knobs, for both forms (schedules are rebuilt lazily)."""
        self.local.retune(wpb, long_threshold, chunk)
        if self._joined is not None:
            self._joined.retune(wpb, long_threshold, chunk)
        self._schedules.clear()

    def _halo(self, rows: int, width: int) -> torch.Tensor:
        dt = self.storage_dtype
        if self.poison:
            return torch.full((rows, width), float("nan"), dtype=dt, device=self.device)
        return torch.empty((rows, width), dtype=dt, device=self.device)

    def _gather(self, sym, halo: torch.Tensor, dv: int, lanes: int, scale: bool, table: bool = False) -> None:
        """mgg_halo_gather_rows on the current stream: halo[h] = (cf[h] *) x_{pe[h]}[row[h]]
        (cf with `scale`); `lanes` per row as the kernel picks them (pow2ceil(dv), at most 32:
        `_layout`'s). `table`: the fused form's list (own rows, then the halo) and column factor
        (the joined executor's)."""
        h = self.plan.halo_size + (self.plan.n_local if table else 0)
        if not h:
            return
        pe, row = (self._table_pe, self._table_row) if table else (self.hpe, self.hrow)
        cf = (self.joined.cf if table else self.cf) if scale else None
        rows_per_block = _GATHER_WPB * (32 // lanes) * _GATHER_ILP
        blocks = max(1, min(-(-h // rows_per_block), self.gather_blocks or self.num_sms * GATHER_BLOCKS_PER_SM))
        cache = self.local.launch_cache
        fn = cache.function(self.gather_module, "mgg_halo_gather_rows")
        with cache.stream():
            fn((blocks,), (32 * _GATHER_WPB,), (np.int64(h), _p(pe), _p(row), np.uint64(sym.data_ptr),
                                               np.int32(dv), _p(cf), _p(halo)))

    def _remote_pass(self, halo: torch.Tensor, out: torch.Tensor, dv: int, lanes: int, vpl: int,
                     scaled: bool, row_factor: bool) -> None:
        """The remote CSR added to `out`: w = 1 on a scaled halo (`scaled`: cf applied by the
        gather or by the rows' producer), else the remote factors; rf[row] unless not `row_factor`."""
        sched = self.schedule(32 // lanes)
        if not sched.num_warps:
            return
        partial = self.local._buf(max(sched.num_slots, 1), out.shape[1])
        mode = WEIGHT_MODES["one" if scaled else self.factors.mode]
        launch_csr_rows(self.local.module, STORAGE_SUFFIX[self.storage_dtype], lanes, vpl, mode, self.local.wpb,
                        self.num_sms, sched, self.indptr, self.src, self.wt,
                        None if scaled else self.cf, self.rf if row_factor else None, None, halo, dv, out,
                        partial, add=True, cache=self.local.launch_cache)

    def __call__(self, x: torch.Tensor, sym, only: str | None = None, scaled_input: bool = False,
                 row_factor: bool = True) -> torch.Tensor:
        """x: float32 [n_local, D] on this GPU; sym: the symmetric array of width D in the storage
        dtype. `only` ("local" or "remote"): that half alone, a partial sum (bench/overlap.py).
        Where `takes_scaled_input` (gcn: W = diag(rf) A diag(cf)): `scaled_input`, x holds cf * x;
        `row_factor=False`, the output without rf (CsrRowsExecutor.__call__); every rank must
        pass the same flags in a call. Collective. Returns float32 [n_local, D]."""
        if only not in (None, "local", "remote"):
            raise ValueError(f"only must be None, 'local' or 'remote', got {only!r}")
        factored = scaled_input or not row_factor
        if factored and not self.takes_scaled_input:
            raise ValueError(f"halo_csr: this plan (kind {self.kind}, local weights {self.local.factors.mode}, "
                             f"remote {self.factors.mode}, storage {self.storage_dtype}) takes no scaled input")
        self.local._check_x(x)
        if sym is None:
            raise ValueError("halo_csr: needs the symmetric array (other ranks read x from it)")
        p = self.plan
        dim = int(x.shape[1])
        if self.storage_dtype == torch.float32 and dim > CSR_ROWS_MAX_DIM_PADDED:  # rows wider than the row kernels take
            if not factored:
                return self._wide_executor()(x, sym, only)
            cf, rf = self.local.cf.unsqueeze(1), self.local.rf.unsqueeze(1)  # the partition kernels' weights
            out = self._wide_executor()(x / cf if scaled_input else x, sym, only)
            return out if row_factor else out / rf
        dv, dp, lanes, vpl = self.local._layout(dim)
        if factored and not scaled_input:  # every rank's slice holds cf * x: scale mine
            x, scaled_input = self.local.cf.unsqueeze(1) * x, True
        if sym.dim_padded != dp or sym.dtype != self.storage_dtype:
            raise ValueError(f"halo_csr: symmetric array is {sym.dtype} [*, {sym.dim_padded}], "
                             f"expected {self.storage_dtype} [*, {dp}]")
        sym.write(x)
        if (only is None and p.halo_size and self.uses_fused(dim)
                and (not factored or self.joined.takes_scaled_input)):
            return self._fused_call(x, sym, dim, dv, dp, lanes, scaled_input, row_factor)
        cur = torch.cuda.current_stream(self.device)
        halo = self._halo(max(p.halo_size, 1), dp)
        run_remote = only != "local" and p.halo_size > 0
        gathered = None
        if run_remote and self.overlap:
            # the publish barrier and the gather on the side stream: the local pass, which reads
            # only this rank's rows, does not wait for the slowest rank
            self.side.wait_stream(cur)  # my written slice and the halo buffer
            with torch.cuda.stream(self.side):
                sym.publish()
                self._gather(sym, halo, dv, lanes, self.prescale and not factored)
            gathered = self._gathered  # one event, recorded again each call
            gathered.record(self.side)
            halo.record_stream(self.side)
        else:
            sym.publish()
            if run_remote:
                self._gather(sym, halo, dv, lanes, self.prescale and not factored)
        if only == "remote":
            out = torch.zeros((p.n_local, 4 * dv * (1 if self.storage_dtype == torch.float32 else 2)),
                              dtype=torch.float32, device=self.device)
        else:
            out = self.local.aggregate_local(x, sym, scaled_input, row_factor)
        if run_remote:
            if gathered is not None:
                cur.wait_event(gathered)
            self._remote_pass(halo, out, dv, lanes, vpl, self.prescale or factored, row_factor)
        sym.release()
        return out if out.shape[1] == dim else out[:, :dim].contiguous()

    def _fused_call(self, x: torch.Tensor, sym, dim: int, dv: int, dp: int, lanes: int, scaled_input: bool,
                    row_factor: bool) -> torch.Tensor:
        """The fused form, x already in my slice (cf * x when `scaled_input`): publish, the table
        of own and halo rows (scaled by the joined cf where it prescales), one pass, release."""
        rows, p = self.joined, self.plan
        prescale = not scaled_input and rows.can_prescale and rows.prescale
        table = self._halo(p.n_local + p.halo_size, dp)
        sym.publish()
        self._gather(sym, table, dv, lanes, prescale, table=True)
        out = rows.aggregate_local(x, sym, scaled_input or prescale, row_factor, table=table)
        sym.release()
        return out if out.shape[1] == dim else out[:, :dim].contiguous()

    def _wide_executor(self):
        """The `halo` partition kernels (up to 1024 floats a row), built on first use."""
        if self._wide is None:
            from .gpu import GPUExecutor

            self._wide = GPUExecutor(self.plan, self.store, variant="halo")
        self._wide.poison = self.poison
        return self._wide


def _dev_opt(a: np.ndarray | None, dev: torch.device) -> torch.Tensor | None:
    return None if a is None else _dev(a, np.float32, dev)
