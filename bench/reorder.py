"""Node reordering before partitioning: what each method does to the partition and the halo.

For one graph and every method of mgg.data.reorder: the reorder seconds, then for P in --parts
the edge-balanced contiguous partition (mgg.runtime.partition.partition_ranges) and the per-rank
forward and transposed (backward) plans (mgg.runtime.plan.build_plan, built for every rank in
this one process exactly as DistGraph does): nodes per rank, local and remote edges, and unique
remote rows (halo) max and sum over ranks. Optionally the single-rank aggregation time on the CPU
executor, and on a CUDA GPU (when present) the single-GPU aggregation time at D=16 and D=64.

    PYTHONPATH=$PWD python bench/reorder.py --dataset reddit-like --scale 0.1
    PYTHONPATH=$PWD python bench/reorder.py --dataset graph.npz --methods none,rcm --parts 2,4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mgg.data import load_dataset  # noqa: E402
from mgg.data.reorder import METHODS, reorder_nodes  # noqa: E402
from mgg.runtime.partition import partition_ranges  # noqa: E402
from mgg.runtime.plan import AggregationPlan, PlanParams, build_plan  # noqa: E402


def forward_rows(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank rows of W (targets in [lo, hi)), as DistGraph._forward_rows: (indptr, global sources)."""
    a, b = int(indptr[lo]), int(indptr[hi])
    return indptr[lo: hi + 1] - a, indices[a:b]


def transposed_rows(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank rows of W^T (sources in [lo, hi)), as DistGraph builds them (mgg.runtime.transpose)."""
    from mgg.runtime.transpose import transposed_rows as rows_of_transpose

    ip, tgt, _ = rows_of_transpose(indptr, indices, lo, hi)
    return ip, tgt


def rank_plans(indptr: np.ndarray, indices: np.ndarray, bounds: np.ndarray, transposed: bool,
               params: PlanParams) -> list[AggregationPlan]:
    """The `sum` plan of every rank (weights do not change the split or the halo)."""
    plans = []
    for r in range(len(bounds) - 1):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        rows = (transposed_rows if transposed else forward_rows)(indptr, indices, lo, hi)
        w = np.ones(len(rows[1]), dtype=np.float32)
        plans.append(build_plan(rows[0], rows[1], w, None, bounds, r, params))
    return plans


def partition_stats(g, num_parts: int, params: PlanParams) -> dict:
    """Partition and plan statistics of `g` over `num_parts` ranks (max/sum over ranks)."""
    indptr = np.asarray(g.indptr, dtype=np.int64)
    indices = np.asarray(g.indices, dtype=np.int64)
    bounds = partition_ranges(indptr, num_parts)
    sizes = np.diff(bounds)
    fwd = rank_plans(indptr, indices, bounds, False, params)
    out = {"P": num_parts, "nodes_max": int(sizes.max()), "nodes_min": int(sizes.min()),
           "edges_max": int(np.diff(indptr[bounds]).max()),
           "local_edges_sum": sum(p.num_local_edges for p in fwd),
           "remote_edges_max": max(p.num_remote_edges for p in fwd),
           "remote_edges_sum": sum(p.num_remote_edges for p in fwd),
           "halo_max": max(p.halo_size for p in fwd), "halo_sum": sum(p.halo_size for p in fwd)}
    del fwd
    if num_parts > 1:
        bwd = rank_plans(indptr, indices, bounds, True, params)
        out["halo_T_max"] = max(p.halo_size for p in bwd)
        out["halo_T_sum"] = sum(p.halo_size for p in bwd)
    else:
        out["halo_T_max"] = out["halo_T_sum"] = 0
    return out


def cpu_aggregation_ms(g, dim: int, reps: int) -> float:
    """Median ms of one `gcn` aggregation at width `dim` on one rank, CPU executor."""
    import torch

    from mgg.runtime import Communicator
    from mgg.graph import DistGraph, RuntimeConfig

    with DistGraph.build(g, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        x = torch.randn(dg.n_local, dim, generator=torch.Generator().manual_seed(0))
        for _ in range(2):
            dg.aggregate(x, "gcn")
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            dg.aggregate(x, "gcn")
            ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def gpu_aggregation_ms(g, dims: tuple[int, ...], reps: int) -> dict:
    """{D: median ms} of one `gcn` aggregation on one GPU (variant auto), or {} without CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig

    out = {}
    with DistGraph.build(g, world(), RuntimeConfig(backend="gpu")) as dg:
        for d in dims:
            x = torch.randn(dg.n_local, d, device=dg.device)
            for _ in range(3):
                dg.aggregate(x, "gcn")
            ts = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                dg.aggregate(x, "gcn")
                torch.cuda.synchronize()
                ts.append((time.perf_counter() - t) * 1e3)
            out[d] = statistics.median(ts)
    return out


def fmt_row(method: str, secs: float, s: dict, base: dict | None, agg: str) -> str:
    def pct(key: str) -> str:
        if base is None or not base.get(key):
            return ""
        return f" ({100.0 * (s[key] - base[key]) / base[key]:+.0f}%)"

    return (f"| {method} | {secs:.2f} | {s['P']} | {s['nodes_max']}/{s['nodes_min']} | {s['edges_max']} | "
            f"{s['local_edges_sum']} | {s['remote_edges_max']} | {s['remote_edges_sum']} | "
            f"{s['halo_max']}{pct('halo_max')} | {s['halo_sum']}{pct('halo_sum')} | "
            f"{s['halo_T_sum']}{pct('halo_T_sum')} |{agg}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="reddit-like", help="a name for mgg.data.load_dataset or a .npz path")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--parts", default="1,2,4,8")
    ap.add_argument("--cpu-agg", type=int, default=16, metavar="D",
                    help="also time the single-rank CPU gcn aggregation at this width (0: skip)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            ap.error(f"--methods: unknown method {m!r}; expected some of {', '.join(METHODS)}")
    parts = [int(p) for p in args.parts.split(",")]
    params = PlanParams()

    t = time.perf_counter()
    g0 = load_dataset(args.dataset, scale=args.scale, seed=0)
    print(f"# {g0.name}: N={g0.num_nodes} E={g0.num_edges} (loaded in {time.perf_counter() - t:.1f} s)")
    results = {"dataset": args.dataset, "scale": args.scale, "nodes": g0.num_nodes, "edges": g0.num_edges,
               "command": " ".join(sys.argv), "methods": {}}
    print("| method | reorder s | P | nodes/rank max/min | edges/rank max | local edges sum | "
          "remote edges max | remote edges sum | halo max (vs none) | halo sum (vs none) | "
          "halo^T sum (vs none) | aggregation |")
    print("|---" * 12 + "|")
    base: dict[int, dict] = {}
    for m in methods:
        t = time.perf_counter()
        g, _ = reorder_nodes(g0, m)
        secs = time.perf_counter() - t
        res = {"reorder_s": secs, "partitions": []}
        if args.cpu_agg > 0:
            res["cpu_agg_ms"] = {args.cpu_agg: cpu_aggregation_ms(g, args.cpu_agg, args.reps)}
        res["gpu_agg_ms"] = gpu_aggregation_ms(g, (16, 64), max(args.reps, 20))
        for p in parts:
            s = partition_stats(g, p, params)
            res["partitions"].append(s)
            agg = ""
            if p == 1:
                bits = [f"CPU D={d}: {v:.0f} ms" for d, v in res.get("cpu_agg_ms", {}).items()]
                bits += [f"GPU D={d}: {v:.3f} ms" for d, v in res["gpu_agg_ms"].items()]
                agg = " " + ", ".join(bits) + " |"
            else:
                agg = " |"
            print(fmt_row(m, secs, s, base.get(p) if m != "none" else None, agg), flush=True)
            if m == "none":
                base[p] = s
        results["methods"][m] = res
        del g
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
