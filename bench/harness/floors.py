"""Lower bounds of one aggregation, measured on the machine that runs it.

compulsory HBM bytes (floor_bytes) / the HBM copy bandwidth, plus the halo over NVLink; and the
gather floor (gather_floor): gathered bytes / the rate the fastest bare gather-sum gets on the
plan's own source-index stream at the same width, its L1/L2 reuse included. The bare gathers
are bench/harness/gather_sum.cu, gather_sum_shfl.cu and gather_rows.cu (compiled by CuPy at run
time), csr_rows' own schedules with every store off (local_csr.cu built with
MGG_CSR_GATHER_ONLY), and source-segmented orders with their extra output passes. `agg_floor`
times every variant's aggregation against both floors.
"""
from __future__ import annotations

import itertools
import os
import statistics

import numpy as np

from mgg.runtime.layout import padded_dim

from .timing import cuda_ms, gpu_ms
from .workloads import variants_for

_CUDA_DIR = os.path.dirname(os.path.abspath(__file__))


def cuda_source(name: str) -> str:
    """The CUDA C++ text of bench/harness/<name>.cu ("gather_sum", "gather_sum_shfl",
    "gather_rows"), for cupy.RawModule(code=...)."""
    with open(os.path.join(_CUDA_DIR, f"{name}.cu")) as f:
        return f.read()


def _cuda_gen():
    """A private CUDA generator for the bench's random tables: a failed CUDA-graph capture leaves
    torch's default CUDA generator marked as capturing, and every later draw from it raises."""
    import torch

    return torch.Generator(device="cuda").manual_seed(0)



def _shfl_rows_in_flight(d4: int) -> list[int]:
    """The U (rows in flight a lane group) gather_sum_shfl is built for at d4 lanes a row: 2, 4, 8
    and 16 wherever U * (32 / d4) divides or is a multiple of 32 (every power-of-two d4)."""
    groups = 32 // d4
    return [u for u in (2, 4, 8, 16) if (u * groups) % 32 == 0 or 32 % (u * groups) == 0]


#: (rows in flight per lane group, blocks per SM, threads per block) tried by gather_bandwidth;
#: the best is the floor (256-thread blocks alone were beaten by csr_rows' 128-thread blocks on
#: reddit-like, D = 64)
_GATHER_SHAPES = ((4, 16, 128), (8, 8, 256), (16, 8, 256), (8, 16, 128), (16, 16, 128), (8, 32, 64), (16, 32, 64))


#: how far a kernel may read past a floor before the bench calls the floor wrong: the spread of
#: repeated timings of one kernel (bench/local_csr.py's rows: within 1% from batch to batch)
FLOOR_SPREAD = 0.01


def floor_note(floor_ms: float, ms: float) -> str:
    """What a bench row says beside its gather-floor ratio: nothing below the floor; "at the
    gather floor" within FLOOR_SPREAD of it; beyond that the floor is wrong, and it says so."""
    if floor_ms <= ms:
        return ""
    if floor_ms <= ms * (1.0 + FLOOR_SPREAD):
        return f"  [at the gather floor: {floor_ms / ms * 100:.1f}%, within the timing's {FLOOR_SPREAD:.0%} spread]"
    return f"  [above the gather floor ({floor_ms / ms * 100:.1f}%): the micro-kernel underrates this graph's gather]"


def _launch_ms(fn, grid: int, block: int, args: tuple, comm) -> float:
    """GPU ms of a launch of CuPy function `fn` (grid, block, args), back to back (gpu_ms)."""
    return gpu_ms(lambda: fn((grid,), (block,), args), comm=comm)


def gather_bandwidth(dim: int, comm, indices=None, table_rows: int | None = None, table_mb: float = 8.0,
                     gathered_gb: float = 1.0, orders=(), rates: list | None = None, indptr=None) -> float:
    """GB/s of gathered rows of width `dim` delivered by the memory system to a bare gather-sum
    kernel (16 B loads, lane groups per row, 4, 8 or 16 rows in flight per group, 2048 threads
    per SM in blocks of 64, 128 or 256, each warp on a balanced slice of the stream or on chunks
    of one moving window: 14 shapes; and gather_sum_shfl, the window-scheduled gather with one
    coalesced index load a lane broadcast by shuffles, as the row kernels load them, at 2, 4, 8
    or 16 rows in flight, on slices or on a window, and the same three block sizes; the best of
    all; no weights, no row bookkeeping, one write per thread).

    With `indices` (the plan's own source-index stream, int [E], into a [table_rows, dim] table)
    this is the rate the hardware gives THIS graph's access pattern -- its L1/L2 reuse included --
    so gathered bytes / it is the gather floor of any aggregation that reads the rows in this
    order. `orders`: further orders of the same stream (int64 position tensors, e.g.
    CsrRowsExecutor.visit_order: the order a row kernel takes the entries in), timed too; the
    best of all orders is returned, so the floor also holds for a kernel whose order has the
    better locality. `rates`: a list that gets each stream's best GB/s (the plan's order first,
    then `orders`; or random, sequential). Without `indices`, it is the best of uniformly random
    and sequential rows of an L2-resident `table_mb` table (a random-row rate is no floor for a
    graph whose hubs repeat in L1).

    `indptr` (int64 [rows + 1], the CSR whose entries `indices` lists, in that order): the plan's
    stream is also timed with gather_rows, the bare gather that walks the CSR's rows (one warp or
    one lane group a row, rows in CSR order, blocks of 64, 128 or 256 threads, with and without
    the next step's indices loaded ahead): with ascending neighbour lists a row kernel's warps in
    flight read neighbouring source rows, a locality the flat-stream shapes do not have (csr_rows
    beat them on reddit-like D = 64 once rows were sorted)."""
    import cupy as cp
    import torch

    dp = padded_dim(dim)
    d4 = dp // 4
    while 32 % d4:            # lane groups need a power of two; wider rows use more loads per lane
        d4 -= 1
    if indices is not None:
        rows = max(1, int(table_rows))
        streams = [torch.from_numpy(np.asarray(indices)).to("cuda", torch.int32)]
        streams += [streams[0][o.to("cuda")] for o in orders]
        n_idx = len(indices)
    else:
        rows = max(1, int(table_mb * 2**20) // (16 * d4))
        n_idx = int(gathered_gb * 1e9) // (16 * d4)
        streams = [torch.randint(0, rows, (n_idx,), device="cuda", dtype=torch.int32, generator=_cuda_gen()),
                   (torch.arange(n_idx, device="cuda", dtype=torch.int64) % rows).to(torch.int32)]
    if n_idx == 0:
        return float("inf")
    table = torch.randn(rows, 4 * d4, device="cuda", generator=_cuda_gen())
    sms = torch.cuda.get_device_properties(table.device).multi_processor_count
    out = torch.empty(sms * max(b * t for _, b, t in _GATHER_SHAPES), 4, device="cuda")
    names = [f"gather_sum<{u}, {w}>" for u in sorted({u for u, _, _ in _GATHER_SHAPES}) for w in ("false", "true")]
    mod = cp.RawModule(code=cuda_source("gather_sum"), options=("-std=c++17",), name_expressions=names)
    shfl_names = [f"gather_sum_shfl<{d4}, {u}, {w}>" for u in _shfl_rows_in_flight(d4) for w in ("false", "true")]
    shfl = cp.RawModule(code=cuda_source("gather_sum_shfl"), options=("-std=c++17",), name_expressions=shfl_names)
    best = 0.0
    for ids in streams:
        args = (np.uint64(table.data_ptr()), np.uint64(ids.data_ptr()), np.int64(n_idx), np.int32(d4),
                np.uint64(out.data_ptr()))
        candidates = [(mod.get_function(f"gather_sum<{u}, {w}>"), sms * per_sm, block, args)
                      for (u, per_sm, block), w in itertools.product(_GATHER_SHAPES, ("false", "true"))]
        candidates += [(shfl.get_function(name), sms * per_sm, block, args[:3] + args[4:])  # d4: a template argument
                       for name, (per_sm, block) in itertools.product(shfl_names, ((8, 256), (16, 128), (32, 64)))]
        if indptr is not None and ids is streams[0]:  # the rows kernels: the stream in CSR order only
            ip = torch.from_numpy(np.asarray(indptr, dtype=np.int64)).to("cuda")
            n_rows = ip.numel() - 1
            rmod = cp.RawModule(code=cuda_source("gather_rows"), options=("-std=c++17",),
                                name_expressions=[f"gather_rows<{d4}, {w}, {pf}>" for w in ("false", "true")
                                                  for pf in ("false", "true")])
            rargs = (np.uint64(table.data_ptr()), np.uint64(ids.data_ptr()), np.uint64(ip.data_ptr()),
                     np.int64(n_rows), np.uint64(out.data_ptr()))
            for (w, per_warp), pf, block in itertools.product((("false", 1), ("true", 32 // d4)), ("false", "true"),
                                                              (64, 128, 256)):
                warps = -(-n_rows // per_warp)
                candidates.append((rmod.get_function(f"gather_rows<{d4}, {w}, {pf}>"),
                                   max(1, -(-warps // (block // 32))), block, rargs))
        stream_best = max(n_idx * 16 * d4 / (_launch_ms(fn, grid, block, a, comm) * 1e6)
                          for fn, grid, block, a in candidates)
        best = max(best, stream_best)
        if rates is not None:
            rates.append(stream_best)
    del table, streams, out
    torch.cuda.empty_cache()
    return best


def csr_rows_orders(p, kind, dim: int) -> list:
    """[the order csr_rows takes plan p's local entries in at width `dim` in one pass] (default
    knobs otherwise), for gather_bandwidth's floor; [] where csr_rows does not run the plan alone
    (remote work). One pass: a bare gather carries no output, so an order of S source-segment
    passes is a candidate only with the output passes it needs (segmented_gather_ms); taken here
    without them (whenever csr_rows runs in segments) it would make the sum kind's floor
    low by those passes."""
    if p.num_remote_edges or not p.num_local_edges:
        return []
    from mgg.kernels.csr_rows import CsrRowsExecutor

    ex = CsrRowsExecutor(p, None, kind, source_segments=1)
    return [ex.visit_order(dim)]


def floor_bytes(p, dp: int) -> dict:
    """Bytes of one aggregation of width `dp` (padded floats) over plan `p`, whatever the kernel.

    compulsory (must come from HBM at least once): an int32 source index per edge (the weights of
    sum / mean / gcn factor into per-row and per-column vectors, so no per-edge weight is
    compulsory), the int64 row pointers of the local and the remote CSR, each table row read once
    (every distinct local source row; with a self term every row, as each row reads its own), the
    output. gathered: every source row an output row sums, its own row included with a self term
    (most of it can hit L2). remote: each unique remote row once over NVLink (the halo)."""
    row = dp * 4
    uniq = len(np.unique(p.local_indices)) if p.num_local_edges else 0
    ptrs = 8 * (p.n_local + 1) * (2 if p.num_remote_edges else 1)
    compulsory = (4 * (p.num_local_edges + p.num_remote_edges) + ptrs
                  + row * ((p.n_local if p.has_self else uniq) + p.n_local))
    self_rows = p.n_local if p.has_self else 0
    return {"compulsory": compulsory, "gathered": row * (p.num_local_edges + p.num_remote_edges + self_rows),
            "remote": row * p.halo_size}


def with_self_entries(indptr, indices) -> tuple[np.ndarray, np.ndarray]:
    """The CSR of A + I from A's (int64 indptr [n + 1], int [E] indices): each row's own index
    appended after its entries. Returns (int64 [n + 1], int32 [E + n])."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n = len(indptr) - 1
    out_ptr = indptr + np.arange(n + 1, dtype=np.int64)
    out = np.empty(int(out_ptr[-1]), dtype=np.int32)
    is_self = np.zeros(len(out), dtype=bool)
    is_self[out_ptr[1:] - 1] = True
    out[is_self] = np.arange(n, dtype=np.int32)
    out[~is_self] = np.asarray(indices)
    return out_ptr, out


def csr_rows_gather_ms(p, kind, dim: int, comm, hbm_GBps: float | None = None,
                       schedules: tuple[dict, ...] = ()) -> float | None:
    """ms of a bare gather in csr_rows' own schedule: plan p's csr_rows call (default knobs; a
    column-mode plan on an already scaled table, so no pre-scale pass) built with
    MGG_CSR_GATHER_ONLY, every store predicated off -- it reads each entry's row and, with a
    self term, each row's own, and writes nothing. In S > 1 source-segment passes the adding
    passes still read the output, and the S - 1 writes beyond one are added at `hbm_GBps` (as
    segmented_gather_ms counts them; without hbm_GBps such a schedule is no candidate: None).
    None where csr_rows does not run the plan alone (remote work) or has nothing to read. On
    one H100 csr_rows read reddit-like D = 64 faster than every flat or row-walking bare gather
    (110% of that floor): its bundles of neighbouring rows keep a table just above the L2's size
    in it better.

    `schedules`: further csr_rows knob sets (CsrRowsExecutor.retune keyword dicts, e.g. the
    mappings bench/local_csr.py times) whose bare gathers are timed too; the fastest is returned,
    so that every schedule a bench row runs is itself a candidate (reddit-like D = 64 sum read
    101.3% of a floor that timed only the default knobs, with bundle window 0 the row that beat
    it; one H200, bench/results/2026-11-27-h200x1-ad8b166 c1)."""
    if p.num_remote_edges or not p.num_local_edges:
        return None
    import cupy as cp
    import torch

    from mgg.kernels.build import build_cubin
    from mgg.kernels.csr_rows import CsrRowsExecutor

    ex = CsrRowsExecutor(p, None, kind)
    ex.module = cp.RawModule(path=build_cubin("local_csr", nvshmem=False, defines=("MGG_CSR_GATHER_ONLY",)).path)
    x = torch.randn(p.n_local, dim, device="cuda", generator=_cuda_gen())
    scaled = ex.can_prescale  # column weights: read the table as if scaled (w = 1), no pass
    best = None
    for knobs in ({}, *schedules):
        if knobs:
            ex.retune(**knobs)
        ms = gpu_ms(lambda: ex.aggregate_local(x, None, scaled_input=scaled), comm=comm)
        segments = ex.segments_for(dim)
        if segments > 1:
            if not hbm_GBps:
                continue
            ms += (segments - 1) * p.n_local * padded_dim(dim) * 4 / (hbm_GBps * 1e6)
        best = ms if best is None else min(best, ms)
    del ex, x
    torch.cuda.empty_cache()
    return best


#: source-segment counts the gather floor also times (segmented_gather_ms)
FLOOR_SEGMENTS = (2, 3, 4, 6)


def segmented_gather_ms(idx, n: int, dim: int, hbm_GBps: float, comm) -> dict:
    """The floor of an aggregation that reads the entries of a CSR (idx: int [E] source rows into
    an [n, dim] table, in row order) in S passes over source ranges (the
    order of mgg.kernels.source_segments): per S in FLOOR_SEGMENTS, the bare gather of the
    stream in that order (gather_bandwidth's flat shapes: each pass's rows are a table S times
    smaller, more of it in L2) plus the output passes it needs beyond one write -- S - 1 reads
    and S - 1 writes of the n output rows -- at the HBM copy bandwidth. Returns {S: ms}."""
    import torch

    from mgg.kernels.source_segments import source_segment_order

    row = padded_dim(dim) * 4
    ix = torch.from_numpy(np.asarray(idx).astype(np.int32))
    out = {}
    for S in FLOOR_SEGMENTS:
        order = source_segment_order(ix, n, S)
        rate = gather_bandwidth(dim, comm, indices=ix[order].numpy(), table_rows=n)
        out[S] = row * len(ix) / (rate * 1e6) + (2 * S - 2) * n * row / (hbm_GBps * 1e6)
    return out


def gather_floor(p, kind, dim: int, comm, rates: list | None = None, hbm_GBps: float | None = None,
                 schedules: tuple[dict, ...] = ()) -> dict:
    """The gather floor of one aggregation of plan `p` at width `dim`: the fastest bare gather
    measured of the rows the aggregation reads -- every entry's source row and, with a self
    term, every row's own (the stream of A + I: with_self_entries; sequential self rows come at
    the rate they get). Candidates: gather_bandwidth's kernels on that stream (flat slices,
    moving windows, row walks; for the plain stream also csr_rows' order) and csr_rows' own
    schedule with its stores off (csr_rows_gather_ms, its segment passes' output writes added).
    Remote entries count at the local
    stream's rate. Returns ms, the GB/s it is taken at, and with a self term `without_self_ms`
    (the plain stream's floor, for comparison); the bytes are floor_bytes' "gathered". `rates`:
    gets each stream's best GB/s (gather_bandwidth), then csr_rows' own (GB/s of the same rows).
    With `hbm_GBps` (a plan without remote work), the source-segmented orders are candidates too
    (segmented_gather_ms, their extra output passes included): `segmented_ms` {S: ms}. A kernel
    may take its entries in any order, so the floor is the best of all. `schedules`: csr_rows
    knob sets whose bare gathers are candidates too (csr_rows_gather_ms)."""
    row = padded_dim(dim) * 4
    remote = row * p.num_remote_edges
    rate = gather_bandwidth(dim, comm, indices=p.local_indices, table_rows=p.n_local,
                            orders=csr_rows_orders(p, kind, dim), rates=rates, indptr=p.local_indptr)
    local = row * p.num_local_edges
    out = {"ms": local / (rate * 1e6), "GBps": rate}
    if p.has_self and p.n_local:
        out["without_self_ms"] = out["ms"]
        ptr, idx = with_self_entries(p.local_indptr, p.local_indices)
        local = row * len(idx)
        self_rate = gather_bandwidth(dim, comm, indices=idx, table_rows=p.n_local, rates=rates, indptr=ptr)
        out.update(ms=local / (self_rate * 1e6), GBps=self_rate)
    own = csr_rows_gather_ms(p, kind, dim, comm, hbm_GBps, schedules)
    if own is not None:
        if rates is not None:
            rates.append(local / (own * 1e6))
        if own < out["ms"]:
            out.update(ms=own, GBps=local / (own * 1e6))
    if hbm_GBps and not p.num_remote_edges and p.num_local_edges:
        idx = with_self_entries(p.local_indptr, p.local_indices)[1] if p.has_self else p.local_indices
        out["segmented_ms"] = segmented_gather_ms(idx, p.n_local, dim, hbm_GBps, comm)
        best = min(out["segmented_ms"].values())
        if best < out["ms"]:
            out.update(ms=best, GBps=local / (best * 1e6))
    out["ms"] += remote / (rate * 1e6)
    return out


def agg_floor(dg, kind, dim, bw, comm, reps=20, wanted: tuple[str, ...] | None = None):
    """Per variant: aggregation ms against two lower bounds (max over ranks): compulsory HBM bytes
    / HBM bandwidth (+ remote bytes / NVLink bandwidth) and gathered bytes / the rate the best
    bare gather-sum gets on this plan's own index stream at this width (gather_bandwidth), both
    measured in this run. (A streaming read of an L2-resident buffer was tried as a third bound:
    8.1-8.6 TB/s on an H200, below the 8.9 TB/s the bare gather gets on reddit-like, whose hub
    rows also hit L1, so it bounded nothing.)"""
    import torch

    p = dg.plan(kind)
    dp = padded_dim(dim)
    gf = gather_floor(p, kind, dim, comm, hbm_GBps=bw["hbm_GBps"])
    b = floor_bytes(p, dp)  # the same for every variant (np.unique over the plan's entries: once)
    nv = b["remote"] / (bw["nvlink_GBps"] * 1e6) if b["remote"] else 0.0
    hbm_max = comm.allreduce_scalar(b["compulsory"] / (bw["hbm_GBps"] * 1e6) + nv, "max")
    l2_max = comm.allreduce_scalar(gf["ms"], "max")
    x = torch.randn(dg.n_local, dim, device=dg.device, generator=_cuda_gen())
    rows = []
    for v in variants_for(dg, wanted):
        dg.set_variant(v)
        dg.aggregate(x, kind)
        ms = statistics.median(cuda_ms(lambda: dg.aggregate(x, kind), reps, comm))
        ms_max = comm.allreduce_scalar(ms, "max")
        rows.append({"variant": v, "agg_ms": ms_max, "hbm_floor_ms": hbm_max, "l2_floor_ms": l2_max,
                     "floor_ms": max(hbm_max, l2_max), "gather_GBps": gf["GBps"],
                     "compulsory_bytes": comm.allreduce_scalar(float(b["compulsory"]), "max"),
                     "gathered_bytes": comm.allreduce_scalar(float(b["gathered"]), "max"),
                     "remote_bytes": comm.allreduce_scalar(float(b["remote"]), "max")})
    dg.set_variant("pipelined")
    return rows
