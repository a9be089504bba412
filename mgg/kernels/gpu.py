"""GPU executor of an AggregationPlan: launchers for mgg/kernels/aggregate.cu.

`GPUExecutor(plan, store, variant)` uploads the plan once into private device memory and, per
call, writes x into the PE's symmetric slice, publishes it (NVSHMEM barrier on the stream), runs
the variant's kernels and releases the slice. The variants (pipelined, pipelined_2pass, ptr,
halo, nonpipelined, paper, paper_nbi), their kernels and shared-memory needs are registered in
mgg.kernels.variants; `__call__` holds their launches.
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.plan import AggregationPlan
from ..runtime.transfer import host_to_device
from .launch import kernel, on_device
from .variants import (MAX_DIM_16, MAX_VPL_16, PLAN_MAX_VPL, check_storage_dtype, get_variant, lane_layout, plan_variant_names,
                       shared_memory_problem)

__all__ = ["GPUExecutor", "VARIANTS", "choose_variant", "HALO_MIN_REUSE", "halo_gather", "launch_smem_bytes",
           "check_shared_memory", "vectors_per_lane"]

#: the registered variants (mgg.kernels.variants is the one list)
VARIANTS = plan_variant_names()  # the variants this executor launches (csr_rows: mgg/kernels/csr_rows/)
#: a remote row repeated this often (remote entries per unique remote row) makes fetching each
#: unique row once (halo) cheaper than per-edge remote reads; measured in docs/kernels.md
HALO_MIN_REUSE = 1.5


def choose_variant(plan: AggregationPlan, storage_dtype: str = "fp32") -> str:
    """The variant "auto" runs.

    A rank with no remote work gets `csr_rows`: the degree-aware local CSR kernel
    (mgg/kernels/local_csr.cu), which writes each row once without atomics (docs/kernels.md).
    With remote work, `halo_csr` when remote rows repeat (each unique row gathered once beside
    the local CSR pass, mgg/kernels/halo_csr.py); else direct NVLink loads (`ptr`), or `halo_csr`
    with a 16-bit `storage_dtype` (bf16 / fp16), which `ptr` has no kernels for."""
    if plan.num_remote_edges == 0:
        return "csr_rows"
    if storage_dtype != "fp32":
        return "halo_csr"
    reuse = plan.num_remote_edges / max(1, plan.halo_size)
    return "halo_csr" if reuse >= HALO_MIN_REUSE else "ptr"


#: storage dtype -> its --storage-dtype name and the suffix of its 16-bit kernels
_STORAGE_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def vectors_per_lane(dim_padded: int) -> int:
    """float4 columns per lane for rows of dim_padded floats (template parameter of the kernels)."""
    return lane_layout(dim_padded, max_vpl=PLAN_MAX_VPL)[1]


def launch_smem_bytes(plan: AggregationPlan, variant: str, dim_padded: int) -> int:
    """Dynamic shared memory per block the variant's launch asks for on this plan (the registry's
    formula at the plan's largest partition size; 0 for a stage without remote partitions)."""
    ps_max = max(plan.ps, plan.ps_inter or plan.ps)
    return get_variant(variant).launch_smem_bytes(ps_max, plan.dist, plan.wpb, dim_padded,
                                                  has_remote=len(plan.remote_parts) > 0)


def check_shared_memory(variant: str, smem: int, limit: int, plan: AggregationPlan) -> None:
    """The launcher's refusal: ValueError when `smem` exceeds the device's opt-in `limit`."""
    problem = shared_memory_problem(smem, limit)
    if problem:
        raise ValueError(f"{variant}: {smem} bytes of shared memory per block exceed the "
                         f"device limit {limit} (ps={plan.ps}, wpb={plan.wpb})")


def _dev(a: np.ndarray, dtype, device) -> torch.Tensor:
    return host_to_device(np.asarray(a), device, dtype)


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def _part_ptr(parts: np.ndarray, n: int) -> np.ndarray:
    """int64 [n + 1]: the partitions of target t are [ptr[t], ptr[t+1]) (parts sorted by target)."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    if len(parts):
        np.cumsum(np.bincount(parts[:, 0], minlength=n), out=ptr[1:])
    return ptr


#: warps a block and rows in flight a lane group of mgg_halo_gather_rows (GATHER_ILP in aggregate.cu),
#: and its grid cap in blocks an SM (mgg.kernels.halo_csr's)
_ROWS_WPB, _ROWS_ILP, _ROWS_BLOCKS_PER_SM = 8, 8, 16


def halo_gather(sym, pe, rows) -> torch.Tensor:
    """Rows rows[i] of PE pe[i]'s slice of symmetric array `sym` -> [k, D] in sym's dtype, in the
    order given (any PE, this one included: its rows come from local memory, the others' over
    NVLink). pe / rows: int32 [k] numpy arrays or tensors on sym's GPU (not copied). One launch of
    mgg_halo_gather_rows, which copies 16-byte vectors (float32 and 16-bit rows alike) with
    several rows in flight a lane group, on torch's current stream."""
    dev = sym.padded.device
    k, dp = len(rows), sym.dim_padded
    out = torch.empty((k, dp), dtype=sym.dtype, device=dev)
    if k:
        hp = pe.to(dev, torch.int32) if isinstance(pe, torch.Tensor) else _dev(pe, np.int32, dev)
        hr = rows.to(dev, torch.int32) if isinstance(rows, torch.Tensor) else _dev(rows, np.int32, dev)
        lanes = min(32, 1 << (int(sym.vecs) - 1).bit_length())
        rows_per_block = _ROWS_WPB * (32 // lanes) * _ROWS_ILP
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        blocks = max(1, min(-(-k // rows_per_block), sms * _ROWS_BLOCKS_PER_SM))
        fn = kernel("aggregate", "mgg_halo_gather_rows", dev, nvshmem=True)
        with on_device(dev):
            fn((blocks,), (32 * _ROWS_WPB,), (np.int64(k), _p(hp), _p(hr), np.uint64(sym.data_ptr),
                                             np.int32(sym.vecs), np.uint64(0), _p(out)))
    return out[:, : sym.dim]


class GPUExecutor:
    """Runs `out = W x + diag * x` for one plan on this rank's GPU.

    With a 16-bit `storage_dtype` (bfloat16 / float16, docs/storage-dtype.md) only the halo
    variant runs (16-bit halo buffer, mgg_local_{bf16,fp16}_v{V}); others raise ValueError.

    Attributes:
        poison: when True, every output / partial / halo buffer is NaN-filled before the kernels
            run (tests use it to prove every element is written).
    """

    def __init__(self, plan: AggregationPlan, store, variant: str = "pipelined",
                 storage_dtype: torch.dtype = torch.float32):
        if variant == "auto":
            variant = choose_variant(plan, _STORAGE_NAME.get(storage_dtype, "fp32"))
        get_variant(variant)  # ValueError naming the registered variants
        if storage_dtype not in _STORAGE_NAME:
            raise ValueError(f"GPUExecutor: storage dtype must be one of {list(_STORAGE_NAME)}, got {storage_dtype}")
        check_storage_dtype(variant, _STORAGE_NAME[storage_dtype])
        self.storage_dtype = storage_dtype
        self.plan, self.store, self.variant = plan, store, variant
        self.poison = False
        dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        p = plan
        self.ps_max = max(p.ps, p.ps_inter or p.ps)
        self.lparts = _dev(p.local_parts, np.int64, dev)
        self.lsrc = _dev(p.local_indices, np.int32, dev)
        self.lwt = _dev(p.local_weight, np.float32, dev)
        self.rparts = _dev(p.remote_parts, np.int64, dev)
        self.rpe = _dev(p.remote_pe, np.int32, dev)
        self.rrow = _dev(p.remote_row, np.int32, dev)
        self.rwt = _dev(p.remote_weight, np.float32, dev)
        self.warps = _dev(p.warps, np.int64, dev)
        self.self_weight = _dev(p.self_weight, np.float32, dev).unsqueeze(1) if p.has_self else None
        if variant in ("halo", "halo_overlap"):
            self.hpe = _dev(p.halo_pe(), np.int32, dev)
            self.hrow = _dev(p.halo_row, np.int32, dev)
            self.rslot = _dev(p.remote_slot, np.int32, dev)
        if variant == "pipelined_2pass":
            self.lptr = _dev(_part_ptr(p.local_parts, p.n_local), np.int64, dev)
            self.rptr = _dev(_part_ptr(p.remote_parts, p.n_local), np.int64, dev)
        from .build import load_module

        self.module = load_module("aggregate", device=dev.index)
        props = torch.cuda.get_device_properties(dev)
        self.num_sms = props.multi_processor_count
        self.smem_limit = int(getattr(props, "shared_memory_per_block_optin", 227 * 1024))
        # halo_overlap: the gather's stream (highest priority: its blocks are scheduled before
        # the local kernel's, which fills the SMs the gather leaves)
        self.side = torch.cuda.Stream(dev, priority=-1) if variant == "halo_overlap" else None

    # -- helpers ------------------------------------------------------------------------------
    def _fn(self, name: str, smem: int):
        fn = self.module.get_function(name)
        check_shared_memory(self.variant, smem, self.smem_limit, self.plan)
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        return fn

    def _grid(self, warps: int, wpb: int) -> tuple[tuple[int], tuple[int]]:
        return (max(1, min(-(-warps // wpb), 2**31 - 1)),), (32 * wpb,)

    def _fill(self, shape) -> torch.Tensor:
        if self.poison:
            return torch.full(shape, float("nan"), dtype=torch.float32, device=self.device)
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def _local(self, out, nparts, parts, src, wt, table_ptr, d4, v, part_out=None):
        if nparts == 0:
            return
        wpb = self.plan.wpb
        warps = min(nparts, self.num_sms * 64)
        fn = self._fn(f"mgg_local_v{v}", 0)
        grid, block = self._grid(warps, wpb)
        fn(grid, block, (np.int64(nparts), _p(parts), _p(src), _p(wt), table_ptr, np.int32(d4), _p(out),
                         _p(part_out), np.int32(part_out is None)))

    def _pipelined(self, out, lpo, rpo, symp, d4: int, v: int, dp: int, mode: int) -> None:
        """Launch `mgg_pipelined_v{v}`: one block of `wpb` warps per `num_blocks`, each warp walking
        its interleaved local/remote partition list. Sums go to `out` with atomics when `lpo`/`rpo`
        are None, else one partial row per local/remote partition (the 2-pass combine reads them).
        `mode` 0: nbi gets into the shared-memory stage; 1: direct NVLink loads (`ptr`)."""
        p = self.plan
        if not p.num_warps:
            return
        # no remote partition, no stage: keeps occupancy up for wide rows
        smem = launch_smem_bytes(p, self.variant, dp)
        fn = self._fn(f"mgg_pipelined_v{v}", smem)
        atomic = lpo is None
        fn((p.num_blocks,), (32 * p.wpb,), (
            np.int64(p.num_warps), _p(self.warps), _p(self.lparts), _p(self.lsrc), _p(self.lwt),
            _p(self.rparts), _p(self.rpe), _p(self.rrow), _p(self.rwt), symp, np.int32(d4),
            np.int32(self.ps_max), _p(out), _p(lpo), _p(rpo), np.int32(atomic), np.int32(mode)),
           shared_mem=smem)

    def _halo16(self, x: torch.Tensor, sym) -> torch.Tensor:
        """The halo variant over a 16-bit symmetric array: gather each unique remote row once
        (16-bit, unchanged), then mgg_local_{bf16,fp16} over my slice and over the halo, float32
        atomics into out; the self term reads x as stored. Collective. Returns float32 [n, D]."""
        p = self.plan
        n, dim = p.n_local, int(x.shape[1])
        if sym.dtype != self.storage_dtype:
            raise ValueError(f"GPUExecutor: symmetric array is {sym.dtype}, the executor stores {self.storage_dtype}")
        if dim > MAX_DIM_16:
            raise ValueError(f"GPUExecutor: embedding width {dim} is above the 16-bit kernels' limit of {MAX_DIM_16}")
        dv = sym.vecs
        v = lane_layout(4 * dv, max_vpl=MAX_VPL_16)[1]
        name = f"mgg_local_{_STORAGE_NAME[self.storage_dtype]}_v{v}"
        L, R, h = len(p.local_parts), len(p.remote_parts), p.halo_size
        symp = np.uint64(sym.data_ptr)
        sym.write(x)
        sym.publish()
        with on_device(self.device):
            out = self._fill((n, 8 * dv))
            out.zero_()
            if self.poison:
                halo = torch.full((max(h, 1), sym.dim_padded), float("nan"), dtype=sym.dtype, device=self.device)
            else:
                halo = torch.empty((max(h, 1), sym.dim_padded), dtype=sym.dtype, device=self.device)
            if h:
                g = self._fn("mgg_halo_gather", 0)
                grid, block = self._grid(min(h, self.num_sms * 64), 8)
                g(grid, block, (np.int64(h), _p(self.hpe), _p(self.hrow), symp, np.int32(dv), _p(halo)))
            fn = self._fn(name, 0)
            for nparts, parts, src, wt, table in ((L, self.lparts, self.lsrc, self.lwt, symp),
                                                  (R, self.rparts, self.rslot, self.rwt, _p(halo))):
                if nparts:
                    grid, block = self._grid(min(nparts, self.num_sms * 64), p.wpb)
                    fn(grid, block, (np.int64(nparts), _p(parts), _p(src), _p(wt), table, np.int32(dv), _p(out)))
            res = out[:, :dim]
            if self.self_weight is not None:
                res = res + self.self_weight * sym.local[:n].to(torch.float32)
            res = res.contiguous()
        sym.release()
        return res

    def _gather_halo(self, symp, d4: int, halo: torch.Tensor | None = None) -> torch.Tensor:
        """Launch `mgg_halo_gather` on the current stream: every unique remote row of the plan,
        once, into `halo` (float32 [max(h, 1), Dp], allocated here when None). Returns it."""
        h = self.plan.halo_size
        if halo is None:
            halo = self._fill((max(h, 1), 4 * d4))
        if h:
            g = self._fn("mgg_halo_gather", 0)
            grid, block = self._grid(min(h, self.num_sms * 64), 8)
            g(grid, block, (np.int64(h), _p(self.hpe), _p(self.hrow), symp, np.int32(d4), _p(halo)))
        return halo

    # -- one aggregation ----------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, sym, only: str | None = None) -> torch.Tensor:
        """x: float32 [n_local, D] on this GPU; sym: the NVSHMEM SymmetricArray of width D (of
        the executor's storage dtype).

        `only` ("local" or "remote", halo variants): run that half alone -- the local partitions,
        or the gather and the remote partitions -- to measure the overlap (bench/overlap.py);
        the result is then a partial sum. Collective. Returns float32 [n_local, D].
        """
        if only not in (None, "local", "remote"):
            raise ValueError(f"only must be None, 'local' or 'remote', got {only!r}")
        if only is not None and self.variant not in ("halo", "halo_overlap"):
            raise ValueError(f"only={only!r} is for the halo variants, not {self.variant!r}")
        run_local, run_remote = only != "remote", only != "local"
        if self.storage_dtype != torch.float32:
            if only is not None:
                raise ValueError("only= measures the float32 halo kernels; not with a 16-bit storage dtype")
            return self._halo16(x, sym)
        p = self.plan
        n, dim = p.n_local, int(x.shape[1])
        dp = sym.dim_padded
        d4 = dp // 4
        v = vectors_per_lane(dp)
        L, R = len(p.local_parts), len(p.remote_parts)
        symp = np.uint64(sym.data_ptr)
        sym.write(x)
        sym.publish()
        with on_device(self.device):
            if self.variant == "pipelined_2pass":
                out = self._fill((n, dp))
            else:
                out = self._fill((n, dp))
                out.zero_()
            if self.variant in ("pipelined", "ptr"):
                self._pipelined(out, None, None, symp, d4, v, dp, mode=0 if self.variant == "pipelined" else 1)
            elif self.variant == "pipelined_2pass":
                lpo, rpo = self._fill((max(L, 1), dp)), self._fill((max(R, 1), dp))
                self._pipelined(out, lpo, rpo, symp, d4, v, dp, mode=0)
                comb = self._fn("mgg_combine", 0)
                grid, block = self._grid(min(n, self.num_sms * 64), 8)
                if n:
                    comb(grid, block, (np.int64(n), _p(self.lptr), _p(self.rptr), _p(lpo), _p(rpo),
                                       np.int32(d4), _p(out)))
            elif self.variant == "nonpipelined":
                smem = launch_smem_bytes(p, self.variant, dp)
                fn = self._fn(f"mgg_split_v{v}", smem)
                if L + R:
                    grid, block = self._grid(L + R, p.wpb)
                    fn(grid, block, (np.int64(L), np.int64(R), _p(self.lparts), _p(self.lsrc), _p(self.lwt),
                                     _p(self.rparts), _p(self.rpe), _p(self.rrow), _p(self.rwt), symp,
                                     np.int32(d4), np.int32(self.ps_max), _p(out)), shared_mem=smem)
            elif self.variant == "halo" or only is not None:
                if run_remote:
                    halo = self._gather_halo(symp, d4)
                if run_local:
                    self._local(out, L, self.lparts, self.lsrc, self.lwt, symp, d4, v)
                if run_remote:
                    self._local(out, R, self.rparts, self.rslot, self.rwt, _p(halo), d4, v)
            elif self.variant == "halo_overlap":
                cur = torch.cuda.current_stream(self.device)
                halo = self._fill((max(p.halo_size, 1), dp))  # (a NaN fill when poisoned: on cur)
                self.side.wait_stream(cur)  # the published store and the halo buffer, filled
                with torch.cuda.stream(self.side), on_device(self.device):
                    self._gather_halo(symp, d4, halo)
                gathered = torch.cuda.Event()
                gathered.record(self.side)
                halo.record_stream(self.side)
                self._local(out, L, self.lparts, self.lsrc, self.lwt, symp, d4, v)  # beside the gather
                cur.wait_event(gathered)
                self._local(out, R, self.rparts, self.rslot, self.rwt, _p(halo), d4, v)
            else:  # paper / paper_nbi: kernel 1 then kernel 2
                self._local(out, L, self.lparts, self.lsrc, self.lwt, symp, d4, v)
                if R:
                    smem = launch_smem_bytes(p, self.variant, dp)
                    fn = self._fn("mgg_remote_get", smem)
                    grid, block = self._grid(min(R, self.num_sms * 64), p.wpb)
                    fn(grid, block, (np.int64(R), _p(self.rparts), _p(self.rpe), _p(self.rrow), _p(self.rwt),
                                     symp, np.int32(d4), np.int32(self.ps_max), _p(out),
                                     np.int32(self.variant == "paper_nbi")), shared_mem=smem)
        sym.release()
        res = out[:, :dim]
        if self.self_weight is not None:
            res = res + self.self_weight * x
        return res.contiguous()
