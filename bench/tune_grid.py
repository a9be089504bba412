"""Exhaustive (ps, dist, wpb) grid vs the runtime tuner, on the GPU (MGG Fig. 11).

    mpirun -np 2 python bench/tune_grid.py --graph reddit-like --scale 0.25
    mpirun -np 4 python bench/tune_grid.py --graph products-like --variants pipelined,ptr,halo

For one graph, P ranks (one GPU each, NVSHMEM store) and the embedding width of the graph:

1. grid: every feasible configuration of the search space (5 x 6 x 5 = 150 per variant, fewer
   where shared memory does not fit) -- the forward GCN aggregation timed with CUDA events,
   median of `--reps` after `--warmup` runs, max over the ranks;
2. tuner: the cross-iteration search driven by the same measurement, one "iteration" per call
   (a fresh run of the search; each switch is prepared by the applier, as in training);
   `--tuner-runs N` repeats the whole search N times (fresh state, same GPU) and reports every
   pick: the spread says how much measurement noise moves the result; `--no-grid --grid-from
   LOG` scores the picks against the grid of an earlier log of the same graph, P and width;
3. the tuning log (trials + grid) is written to bench/results/tune-grid-<graph>-P<P>-<date>.json;
   `python -m mgg.tune --report` on it prints the table and draws the Fig. 11 heat maps with the
   tuner's path. The summary line gives the tuner's pick over the grid optimum and the number of
   iterations the search took (the paper reports about 10 and up to 68% saved vs (1, 1, 1)).

Needs the GPU backend (mgg.kernels.gpu); it refuses to run on the CPU backend unless `--cpu` is
given (then only ps matters: a smoke test of the script itself).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="reddit-like", choices=["reddit-like", "products-like", "papers-like"])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the preset's size")
    ap.add_argument("--dim", type=int, default=None, help="embedding width (default: the graph's features)")
    ap.add_argument("--kind", default="gcn")
    ap.add_argument("--variants", default="pipelined", help="comma-separated GPU kernel variants")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-grid", action="store_true", help="tuner only")
    ap.add_argument("--grid-from", default=None, metavar="LOG",
                    help="with --no-grid: score the picks against the grid saved in this earlier log")
    ap.add_argument("--tuner-warmup", type=int, default=0, help="iterations ignored after each switch")
    ap.add_argument("--tuner-runs", type=int, default=1, help="independent searches to run")
    ap.add_argument("--cpu", action="store_true", help="allow the CPU backend (smoke test)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from mgg.data.generators import preset
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig
    from mgg.tuning import (AggregationTuner, DeviceLimits, DistGraphApplier, PlanCache,
                            SearchSpace, TuneKey, atomic_write_json, distgraph_workload,
                            feasible, kernel_version)

    comm = world()
    graph = preset(args.graph, args.scale, seed=0)
    dim = args.dim or int(graph.x.shape[1])
    backend = "cpu" if args.cpu else "gpu"
    dg = DistGraph.build(graph, comm, RuntimeConfig(ps=1, dist=1, wpb=1, backend=backend))
    if dg.backend != "gpu" and not args.cpu:
        print("tune_grid: the GPU backend is not available (use --cpu for a smoke test)", file=sys.stderr)
        return 2
    limits = DeviceLimits.from_device(dg.device) if dg.device.type == "cuda" else DeviceLimits.cpu()
    variants = tuple(v for v in args.variants.split(",") if v)
    space = SearchSpace(variants=variants)
    apply = DistGraphApplier(dg, PlanCache(capacity=len(space.ps_values)))  # every ps cut once
    x = torch.randn(dg.n_local, dim, device=dg.device)

    def measure(reps: int, warmup: int) -> float:
        for _ in range(warmup):
            dg.aggregate(x, args.kind)
        ts = []
        for _ in range(reps):
            comm.barrier()
            if dg.device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dg.aggregate(x, args.kind)
                b.record()
                b.synchronize()
                ms = a.elapsed_time(b)
            else:
                t0 = time.perf_counter()
                dg.aggregate(x, args.kind)
                ms = (time.perf_counter() - t0) * 1e3
            ts.append(ms)
        return float(comm.allreduce_scalar(statistics.median(ts), "max"))

    grid = []
    if args.grid_from:
        grid = _saved_grid(args.grid_from, graph.fingerprint(), comm.size, dim)
    elif not args.no_grid:
        cfgs = [c for v in variants for c in space.grid(v) if feasible(c, dim, limits)]
        t0 = time.perf_counter()
        for i, c in enumerate(cfgs):
            apply(c)
            lat = measure(args.reps, args.warmup)
            grid.append({**c.to_dict(), "latency_ms": lat})
            if comm.rank == 0:
                print(f"grid {i + 1}/{len(cfgs)} {c.label()}: {lat:.4f} ms", flush=True)
        if comm.rank == 0:
            print(f"grid: {len(cfgs)} configurations in {time.perf_counter() - t0:.1f} s")

    # the tuner, one aggregation per "iteration" (the applier prepares each switch, as in training)
    wl = distgraph_workload(dg, (args.kind,), space, comm)
    runs = []
    for _ in range(max(1, args.tuner_runs)):
        tuner = AggregationTuner(apply, dim, limits, space=space, workload=wl, comm=comm,
                                 warmup=args.tuner_warmup)
        iters = 0
        while not tuner.done:
            tuner.step(measure(1, 0))
            iters += 1
        runs.append({**tuner.best.to_dict(), "measurements": tuner.search_iterations,
                     "iterations": iters})
    log = tuner.log_dict()
    log["key"] = TuneKey(graph.fingerprint(), comm.size, dim, limits.name, kernel_version(),
                         f"kinds={args.kind}").to_dict()
    log["grid"] = grid
    log["bench"] = {"graph": args.graph, "scale": args.scale, "nodes": int(graph.num_nodes),
                    "edges": int(graph.num_edges), "P": comm.size, "reps": args.reps,
                    "iterations_incl_warmup": iters, "tuner_runs": runs, "host": platform.node(),
                    "date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "command": " ".join(sys.argv), "grid_from": args.grid_from}
    if comm.rank == 0:
        name = f"tune-grid-{args.graph}-P{comm.size}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
        out = args.out or os.path.join(ROOT, "bench", "results")
        if os.path.isdir(out):  # a folder: the file gets its standard name inside it
            out = os.path.join(out, name)
        atomic_write_json(out, log)
        best = tuner.best
        line = f"tuner: {tuner.search_iterations} measurements ({iters} iterations incl. warmup), pick {best.label()}"
        if grid:
            gl = {(g["ps"], g["dist"], g["wpb"], g["variant"]): g["latency_ms"] for g in grid}
            opt = min(gl.values())
            mine = gl.get((best.ps, best.dist, best.wpb, best.variant))
            start = gl.get((1, 1, 1, variants[0]))
            line += (f"; grid optimum {opt:.4f} ms, pick on the grid {mine:.4f} ms = {mine / opt:.3f} x"
                     f"; (1,1,1) {start:.4f} ms" if mine is not None and start is not None else "")
        print(line)
        for i, r in enumerate(runs):
            mark = ""
            if grid:
                lat = gl.get((r["ps"], r["dist"], r["wpb"], r["variant"]))
                mark = f": {lat:.4f} ms on the grid = {lat / opt:.3f} x optimum" if lat is not None else ""
            print(f"tuner run {i + 1}: ps={r['ps']} dist={r['dist']} wpb={r['wpb']} {r['variant']} in "
                  f"{r['measurements']} measurements{mark}")
        if grid and len(runs) > 1:
            ratios = [gl[(r["ps"], r["dist"], r["wpb"], r["variant"])] / opt for r in runs]
            ms = [r["measurements"] for r in runs]
            print(f"tuner over {len(runs)} independent runs: pick/optimum median {statistics.median(ratios):.3f} "
                  f"max {max(ratios):.3f}, within 5% in {sum(r <= 1.05 for r in ratios)}/{len(runs)}; "
                  f"measurements median {statistics.median(ms)} max {max(ms)}")
        print(f"log: {out}  (python -m mgg.tune --report {out})")
    dg.close()
    return 0


def _saved_grid(path: str, fingerprint: str, world_size: int, dim: int) -> list[dict]:
    """The grid of an earlier tune_grid log, after checking it is of this graph, P and width."""
    import json

    with open(path) as f:
        log = json.load(f)
    key, grid = log.get("key", {}), log.get("grid") or []
    if not grid:
        raise SystemExit(f"tune_grid: {path} holds no grid")
    for field, want in (("fingerprint", fingerprint), ("world_size", world_size), ("dim", dim)):
        if key.get(field) != want:
            raise SystemExit(f"tune_grid: {path} is of another run: key.{field} = {key.get(field)!r}, "
                             f"this run has {want!r}")
    return grid


if __name__ == "__main__":
    sys.exit(main())
