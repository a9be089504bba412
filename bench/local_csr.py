"""Micro-benchmark of the single-GPU aggregation: csr_rows (mgg/kernels/local_csr.cu) against the
`paper` local path (mgg_local, one float4 atomic per partition) and torch CSR SpMM, with floors.

    python bench/local_csr.py [--datasets reddit-like:1,products-like:1] [--dims 16,64]
                              [--kinds gcn,sum] [--reps 30] [--json out.json]

One GPU, one process (P = 1). Per dataset, width D and kind it prints the median of `--reps`
CUDA-event timings of one aggregation call (whole call: `paper` includes its symmetric-array
write, zero-fill and self-term add; csr_rows writes every row once with the self term fused) for
  * csr_rows with the kind's weight-free mode (also at 1, 2 and 3 source segments;
    `csr_rows default` is the automatic count) (and with per-edge weights, `csr_rows-weighted`),
    over a small grid of (wpb, chunk), and `csr_rows bf16` / `csr_rows fp16`: the same kernel
    reading rows stored in 16 bits (--storage-dtype; default knobs; their HBM and gather
    floors count 2 * round_up(D, 8) bytes per row),
  * GPUExecutor variant `paper` (on P = 1 it runs only mgg_local) through DistGraph,
  * torch sparse CSR @ x (cuSPARSE),
and two floors:
  * HBM floor: compulsory bytes (int32 index per edge, float32 weight per edge only where the
    kernel reads it, int64 row pointers, each table row read once -- the distinct source rows, or
    every row with a self term --, the output) / the measured device-copy bandwidth;
  * gather floor: gathered bytes (E * Dp * 4, and (E + n) * Dp * 4 with a self term) / the rate
    a bare gather-sum kernel (bench/harness/floors.py gather_floor, gather_bandwidth) gets on this
    plan's own source-index stream (and on A + I's) at this width -- the memory system's
    delivery for this access pattern, L1/L2 reuse included; also the same stream in S
    source-segment passes (mgg.kernels.source_segments: each pass reads a table S times smaller),
    plus the S - 1 output reads and writes those passes add, at the HBM copy bandwidth; the
    floor is the best of all orders (a kernel may take the entries in any). The
    random/sequential rates of an L2-resident 8 MB table are printed beside it for context (a
    random-row rate is no floor: the graph's hubs repeat and hit L1). A streaming read of an
    L2-resident buffer is no bound either: 8.1-8.6 TB/s on an H200, below what the bare gather
    gets on reddit-like (8.9 TB/s; its hub rows also hit L1).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_L2_SRC = r"""
extern "C" __global__ void l2_gather_unrolled(const float4* __restrict__ table, const int* __restrict__ idx,
                                              long long n_idx, int d4, float4* __restrict__ out) {
    // groups of d4 lanes (d4 a power of two <= 32); each group keeps 8 independent rows in flight
    const int lane = threadIdx.x & 31, groups = 32 / d4, g = lane / d4, c = lane % d4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    const long long per = (n_idx + nwarps - 1) / nwarps, lo = warp * per;
    const long long hi = lo + per < n_idx ? lo + per : n_idx;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long long k = lo + g; k < hi; k += 8 * groups) {
        int j[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) { long long q = k + (long long)u * groups; j[u] = q < hi ? __ldcs(idx + q) : -1; }
#pragma unroll
        for (int u = 0; u < 8; ++u) if (j[u] >= 0) {
            float4 v = __ldg(table + (long long)j[u] * d4 + c);
            acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
        }
    }
    out[blockIdx.x * (long long)blockDim.x + threadIdx.x] = acc;
}
"""


def event_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `reps` CUDA-event timings, each call alone (the host's
    time from the first event to the call's first launch included; the probes' timing)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def call_ms(fn, reps: int) -> float:
    """GPU milliseconds of fn() run back to back (bench.harness.timing.gpu_ms, the way the floors are
    timed): `reps` calls, five batches of max(1, reps // 5) after three warm-ups."""
    from bench.harness.timing import gpu_ms

    return gpu_ms(fn, calls=max(1, reps // 5), batches=5)


def hbm_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write bytes)."""
    import torch

    n = 1 << 28
    a = torch.empty(n, device="cuda").uniform_()
    b = torch.empty_like(a)
    ms = call_ms(lambda: b.copy_(a), 10)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 4 * n / ms / 1e6


def l2_gather_bandwidth(dim: int, table_mb: float = 8.0, gathered_gb: float = 1.0) -> dict:
    """GB/s of row gathers from an L2-resident table at width `dim`: two kernels, random and
    sequential rows; "best" is the largest (the L2 floor's bandwidth)."""
    import cupy as cp
    import torch

    from bench.harness.floors import cuda_source

    dp = max(4, (dim + 3) // 4 * 4)
    d4 = dp // 4
    while 32 % d4:
        d4 -= 1
    rows = max(1, int(table_mb * 2**20) // (16 * d4))
    n_idx = int(gathered_gb * 1e9) // (16 * d4)
    table = torch.randn(rows, 4 * d4, device="cuda")
    idx = torch.randint(0, rows, (n_idx,), device="cuda", dtype=torch.int32)
    sms = torch.cuda.get_device_properties(table.device).multi_processor_count
    grid, block = sms * 8, 256
    out = torch.empty(grid * block, 4, device="cuda")
    # sequential rows of the same table: every warp streams contiguous L2 lines, the most L2 can
    # deliver; the real graph's reuse (hub rows shared by neighbouring warps, L1 hits) can beat
    # random rows, so the floor uses the best of all
    seq = (torch.arange(n_idx, device="cuda", dtype=torch.int64) % rows).to(torch.int32)
    res = {}
    gather8 = cp.RawModule(code=cuda_source("gather_sum"), options=("-std=c++17",),
                           name_expressions=["gather_sum<8, false>"]).get_function("gather_sum<8, false>")
    for name, fn in (("fullgraph", gather8), ("unrolled", cp.RawKernel(_L2_SRC, "l2_gather_unrolled"))):
        for pattern, ids in (("", idx), ("-seq", seq)):
            args = (np.uint64(table.data_ptr()), np.uint64(ids.data_ptr()), np.int64(n_idx), np.int32(d4),
                    np.uint64(out.data_ptr()))
            ms = call_ms(lambda: fn((grid,), (block,), args), 10)
            res[name + pattern] = n_idx * 16 * d4 / (ms * 1e6)
    del table, idx, seq, out
    torch.cuda.empty_cache()
    res["best"] = max(res.values())
    return res


def distinct_sources(plan) -> int:
    """How many distinct source rows the plan's local CSR reads."""
    if not plan.num_local_edges:
        return 0
    seen = np.zeros(plan.n_local, bool)
    seen[plan.local_indices] = True
    return int(seen.sum())


def compulsory_bytes(plan, dp: int, weights: bool, uniq: int) -> int:
    """Bytes any kernel must move from/to HBM once for out = W x (+ diag x) at width dp: indices
    (and weights), row pointers, each table row read once (every row with a self term), output."""
    row = dp * 4
    per_edge = 4 + (4 if weights else 0)
    return (per_edge * plan.num_local_edges + 8 * (plan.n_local + 1)
            + row * ((plan.n_local if plan.has_self else uniq) + plan.n_local))


def load_graph(name: str, scale: float, cache: str):
    from mgg.data import load_dataset, load_npz, save_npz

    path = os.path.join(cache, f"{name}-{scale:g}.npz")
    if not os.path.exists(path):
        t = time.perf_counter()
        g = load_dataset(name, scale=scale, seed=0)
        print(f"  generated {name} scale {scale:g} in {time.perf_counter() - t:.1f} s", flush=True)
        os.makedirs(cache, exist_ok=True)
        save_npz(g, path)
    return load_npz(path, name=name)


def bench_dataset(g, dims, kinds, args, hbm) -> list[dict]:
    import torch

    from mgg.kernels.csr_rows import (DEFAULT_BUNDLE_BATCHES, DEFAULT_BUNDLE_WINDOW, DEFAULT_CHUNK, DEFAULT_WPB,
                                      CsrRowsExecutor)
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig
    from mgg.runtime.weights import diag_weights, pair_weights

    rows = []
    comm = world()
    with DistGraph(g.indptr, g.indices, comm, RuntimeConfig(backend="gpu", variant="paper")) as dg:
        a_csr = torch.sparse_csr_tensor(torch.from_numpy(g.indptr), torch.from_numpy(g.indices),
                                        torch.ones(g.num_edges), size=(g.num_nodes, g.num_nodes)).cuda()
        for kind in kinds:
            plan = dg.plan(kind)
            # the reference's weights from the graph as given (the plan's entries are sorted per row)
            deg = np.diff(g.indptr)
            targets = np.repeat(np.arange(g.num_nodes), deg)
            w_csr = torch.sparse_csr_tensor(a_csr.crow_indices(), a_csr.col_indices(),
                                            torch.from_numpy(pair_weights(kind, deg, targets, g.indices)).cuda(),
                                            size=a_csr.shape)
            del targets
            ref_diag = diag_weights(kind, deg, np.arange(g.num_nodes))
            t0 = time.perf_counter()
            fast = CsrRowsExecutor(plan, None, kind)
            weighted = CsrRowsExecutor(plan, None, None)
            prep = time.perf_counter() - t0
            # --storage-dtype bf16 / fp16: the same kernel reading 16-bit rows (8 per 16-byte load)
            narrow = {f"csr_rows {n}": CsrRowsExecutor(plan, None, kind, storage_dtype=dt)
                      for n, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16))}
            if narrow["csr_rows bf16"].factors.mode == "column" and not narrow["csr_rows bf16"].column_by_weights:
                narrow["csr_rows bf16 weighted"] = CsrRowsExecutor(plan, None, None, storage_dtype=torch.bfloat16)
            uniq = distinct_sources(plan)
            for dim in dims:
                dp = max(4, (dim + 3) // 4 * 4)
                x = torch.randn(g.num_nodes, dim, device="cuda")
                l2 = l2_gather_bandwidth(dim)
                from bench.harness.floors import floor_note, gather_floor
                rates: list = []
                schedules = tuple(dict(row_mapping=m, bundle_batches=b, bundle_window=w, wpb=wpb, chunk=chunk)
                                  for m, b, w in args.mappings for wpb in args.wpb for chunk in args.chunks)
                floor = gather_floor(plan, kind, dim, comm, rates=rates, hbm_GBps=hbm, schedules=schedules)
                own = floor["GBps"]
                l2["graph-stream"] = own
                l2_floor = floor["ms"]  # the floor: a bare gather of this graph's index stream (A + I's with a self term)
                res = {}
                for ex, label in ((fast, "csr_rows"), (weighted, "csr_rows-weighted")):
                    for mapping, batches, window in (args.mappings if ex is fast else [("bundles", 8, 0)]):
                        ex.retune(row_mapping=mapping, bundle_batches=batches, bundle_window=window)
                        name = label if ex is not fast else \
                            f"{label} {mapping}{'' if mapping == 'packed' else batches}{f'w{window}' if window else ''}"
                        for wpb in args.wpb:
                            for chunk in args.chunks:
                                ex.retune(wpb=wpb, chunk=chunk)
                                ms = call_ms(lambda: ex(x), args.reps)
                                hb = compulsory_bytes(plan, dp, ex.factors.mode == "weighted", uniq) / (hbm * 1e6)
                                res[f"{name} wpb={wpb} chunk={chunk}"] = (ms, hb)
                fast.retune(row_mapping="default", bundle_batches=DEFAULT_BUNDLE_BATCHES,
                            bundle_window=DEFAULT_BUNDLE_WINDOW)
                fast.retune(wpb=DEFAULT_WPB, chunk=DEFAULT_CHUNK)
                if fast.factors.mode == "column":  # A/B at the default knobs: cf[src] in the kernel or a scaled table
                    for prescale in (True, False):
                        fast.prescale = prescale
                        ms = call_ms(lambda: fast(x), args.reps)
                        res["csr_rows default, " + ("table scaled by cf" if prescale else "cf[src] per edge")] = (
                            ms, compulsory_bytes(plan, dp, False, uniq) / (hbm * 1e6))
                    fast.prescale = fast.default_prescale
                    if fast.takes_scaled_input:  # the table scaled by the op that produced it (GCN's
                        xs = x * fast.cf.unsqueeze(1)  # dropout before a gcn aggregation): no pass
                        ms = call_ms(lambda: fast(xs, scaled_input=True), args.reps)
                        res["csr_rows default, table scaled by its producer"] = (
                            ms, compulsory_bytes(plan, dp, False, uniq) / (hbm * 1e6))
                        del xs
                    if fast.can_prescale and dp == dim:  # the pre-scale pass alone, beside a copy of its bytes
                        xs = x.contiguous()
                        scale_ms = call_ms(lambda: fast._scale_rows(xs, dp // 4), args.reps)
                        copy_ms = call_ms(lambda: xs.clone(), args.reps)
                        print(f"  {g.name} D={dim} {kind}: pre-scale pass {scale_ms:.3f} ms, a copy of the same "
                              f"bytes {copy_ms:.3f} ms", flush=True)
                else:
                    ms = call_ms(lambda: fast(x), args.reps)
                    res["csr_rows default"] = (ms, compulsory_bytes(plan, dp, False, uniq) / (hbm * 1e6))
                auto_segments = fast.segments_for(dim)
                for count in (1, 2, 3):  # source segments (the default picks auto_segments)
                    fast.retune(source_segments=count)
                    ms = call_ms(lambda: fast(x), args.reps)
                    res[f"csr_rows default, {count} source segment{'s' if count > 1 else ''}"] = (
                        ms, compulsory_bytes(plan, dp, False, uniq) / (hbm * 1e6))
                fast.retune(source_segments=None)
                timed = []
                for label, ex in narrow.items():  # default knobs, then bundles forced (the 16-bit layouts
                    ex.retune(row_mapping="default")  # have 2, 4 or 8 lanes: not all in BUNDLE_LANES)
                    timed.append((label, ex, None))
                    if not ex.uses_bundles(*ex._layout(dim)[2:]):
                        timed.append((label + " bundles", ex, "bundles"))
                for label, ex, mapping in timed:  # its row bytes are 2 * round_up(D, 8)
                    ex.retune(row_mapping=mapping or "default")
                    ms = call_ms(lambda: ex(x), args.reps)
                    dp16 = max(8, (dim + 7) // 8 * 8) // 2  # the same bytes as this many floats
                    reads_wt = ex.factors.mode == "weighted" or ex.column_by_weights
                    res[label] = (ms, compulsory_bytes(plan, dp16, reads_wt, uniq) / (hbm * 1e6),
                                  l2_floor * dp16 / dp)  # 16-bit rows: half the gathered bytes
                    if mapping is None and ex.takes_scaled_input:  # as training runs it: the producer
                        xs = x * ex.cf.unsqueeze(1)  # wrote cf * x; rounded once, w = 1, no weights
                        ms = call_ms(lambda: ex(xs, scaled_input=True), args.reps)
                        res[label + ", table scaled by its producer"] = (
                            ms, compulsory_bytes(plan, dp16, False, uniq) / (hbm * 1e6), l2_floor * dp16 / dp)
                        del xs
                dg.set_variant("paper")
                ms = call_ms(lambda: dg.aggregate(x, kind), args.reps)
                res["paper (mgg_local)"] = (ms, compulsory_bytes(plan, dp, True, uniq) / (hbm * 1e6))
                diag = torch.from_numpy(ref_diag).cuda().unsqueeze(1) if ref_diag is not None else None
                ms = call_ms(lambda: (w_csr @ x) + (diag * x if diag is not None else 0), args.reps)
                res["torch csr (cuSPARSE)"] = (ms, compulsory_bytes(plan, dp, True, uniq) / (hbm * 1e6))
                ref = (w_csr @ x) + (diag * x if diag is not None else 0)
                err = float((fast(x) - ref).norm() / ref.norm())
                if fast.takes_scaled_input:
                    err = max(err, float((fast(x * fast.cf.unsqueeze(1), scaled_input=True) - ref).norm() / ref.norm()))
                if not err < 1e-5:  # a wrong answer is no timing: stop the run
                    raise SystemExit(f"local_csr: {g.name} D={dim} {kind}: csr_rows differs from the cuSPARSE "
                                     f"reference by {err:.1e} (relative norm)")
                print(f"  {g.name} D={dim} {kind}: mode {fast.factors.mode} ({fast.factors.note}"
                      f"{'; the table scaled by cf, then w = 1' if fast.prescale else ''}), "
                      f"prep {prep:.2f} s, rel err vs cuSPARSE {err:.1e}; "
                      f"gather rate on this graph's index stream {own:.0f} GB/s (row order / csr_rows' order"
                      f"{' / A + I' if plan.has_self else ''} / csr_rows' schedule, stores off: "
                      f"{' / '.join(f'{r:.0f}' for r in rates)}"
                      + (f"; without the self rows {floor['without_self_ms']:.3f} ms" if 'without_self_ms' in floor else '')
                      + ("; in S source-segment passes (+ their output passes) " + ", ".join(
                          f"S={k} {v:.3f}" for k, v in floor["segmented_ms"].items()) + " ms"
                         if "segmented_ms" in floor else "")
                      + f"; csr_rows' default: {auto_segments} source segment(s)"
                      + f"; L2-resident table: random "
                      f"{l2['fullgraph']:.0f}/{l2['unrolled']:.0f}, sequential {l2['fullgraph-seq']:.0f}/"
                      f"{l2['unrolled-seq']:.0f}), gather floor {l2_floor:.3f} ms", flush=True)
                for label, (ms, hb, *gf) in res.items():
                    gfl = gf[0] if gf else l2_floor
                    # a kernel above a floor means the floor is wrong: say so beside the ratio
                    note = floor_note(gfl, ms)
                    print(f"    {label:>36}: {ms:7.3f} ms | HBM floor {hb:.3f} ms ({hb / ms * 100:3.0f}%) | "
                          f"gather floor {gfl:.3f} ms ({gfl / ms * 100:3.0f}%){note}", flush=True)
                    rows.append({"dataset": g.name, "nodes": g.num_nodes, "edges": g.num_edges, "dim": dim,
                                 "kind": kind, "system": label, "ms": ms, "hbm_floor_ms": hb,
                                 "l2_floor_ms": gfl, "l2_GBps": l2, "hbm_GBps": hbm,
                                 "mode": fast.factors.mode, "prep_s": prep, "rel_err": err})
                del x
            del fast, weighted, narrow, w_csr
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1")
    ap.add_argument("--dims", default="16,64")
    ap.add_argument("--kinds", default="gcn,sum")
    ap.add_argument("--wpb", default="4,8")  # csr_rows' default is 4 (DEFAULT_WPB)
    ap.add_argument("--chunks", default="1024,4096")
    ap.add_argument("--mappings", default="packed,bundles:8",
                    help="csr_rows short-row mappings to time: packed (one row per lane group) and "
                    "bundles:B (runs of consecutive rows of about B batches of entries; layouts of one "
                    "vector per lane, D <= 128 float32; wider ones run packed; bundles:B:W sorts them by size "
                    "inside windows of W runs in row order) and default:B (bundles "
                    "for the layouts of BUNDLE_LANES, packed elsewhere)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "mgg", "bench"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.wpb = [int(v) for v in args.wpb.split(",")]
    args.chunks = [int(v) for v in args.chunks.split(",")]
    mappings = []
    for spec in args.mappings.split(","):   # mapping[:batches[:window]]
        parts = spec.split(":")
        mappings.append((parts[0], int(parts[1]) if len(parts) > 1 else 8, int(parts[2]) if len(parts) > 2 else 0))
    args.mappings = mappings
    import torch

    print(f"device {torch.cuda.get_device_name()}", flush=True)
    hbm = hbm_bandwidth()
    print(f"HBM copy bandwidth {hbm:.0f} GB/s", flush=True)
    rows = []
    for spec in args.datasets.split(","):
        name, _, scale = spec.partition(":")
        g = load_graph(name, float(scale or 1), args.cache)
        print(f"{name}: {g.num_nodes} nodes, {g.num_edges} edges", flush=True)
        rows += bench_dataset(g, [int(d) for d in args.dims.split(",")], args.kinds.split(","), args, hbm)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
