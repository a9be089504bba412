"""Measure the node- vs edge-centric crossover of the fused GAT kernels (fuseGNN's choice).

    python bench/gat_threshold.py                       # GPU (or CPU with --backend cpu)
    mpirun -np 2 python bench/gat_threshold.py          # per-rank plans with remote neighbors

For each average degree d in --degrees, a uniform random graph with about --edges edges
(N = edges / d nodes) is built; the fused attention aggregation (additive, 8 heads x 8, self loops)
runs forward + backward with strategy "node" and with "edge", median of --reps after --warmup.
The table gives both times, the ratio edge / node and the winner; the crossover is the smallest d
from which node-centric wins at every larger measured degree -- the measured value of
mgg.graph.adaptive.NODE_CENTRIC_MIN_AVG_DEGREE. A skewed (power-law) graph of the same size
checks the MAX_DEGREE_SKEW guard. Results: bench/results/gat-threshold-<backend>-P<P>-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.atomic import atomic_write_json  # noqa: E402
from mgg.graph.adaptive import degree_stats, fused_aggregation  # noqa: E402
from mgg.nn.conv.gat_conv import attention_aggregate  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig  # noqa: E402


def uniform_csr(n: int, d: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    e = int(n * d)
    tgt = np.sort(rng.integers(0, n, e))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(indptr, tgt + 1, 1)
    return np.cumsum(indptr), rng.integers(0, n, e).astype(np.int64)


def powerlaw_csr(n: int, d: float, seed: int, alpha: float = 1.2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** alpha
    deg = rng.multinomial(int(n * d), w / w.sum())
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    return indptr, rng.integers(0, n, int(indptr[-1])).astype(np.int64)


def time_strategy(dg, strategy: str, heads: int, C: int, reps: int, warmup: int) -> float:
    dev = dg.device
    g = torch.Generator(device="cpu").manual_seed(0)
    feat = torch.randn(dg.n_local, heads, C, generator=g).to(dev).requires_grad_(True)
    src = torch.randn(dg.n_local, heads, generator=g).to(dev).requires_grad_(True)
    dst = torch.randn(dg.n_local, heads, generator=g).to(dev).requires_grad_(True)
    go = torch.randn(dg.n_local, heads, C, generator=g).to(dev)
    ts = []
    for i in range(warmup + reps):
        dg.comm.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = attention_aggregate(feat, src, dst, dg, strategy=strategy)
        out.backward(go)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dt = dg.comm.allreduce_scalar(time.perf_counter() - t0, "max")
        if i >= warmup:
            ts.append(dt * 1e3)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--degrees", default="2,4,8,16,32,64,128,256,512")
    ap.add_argument("--edges", type=float, default=4e6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args(argv)
    comm = world()
    rows = []
    graphs = [("uniform", float(d)) for d in args.degrees.split(",")]
    graphs.append(("powerlaw", 32.0))
    for shape, d in graphs:
        n = max(64, int(args.edges / d))
        indptr, indices = (uniform_csr if shape == "uniform" else powerlaw_csr)(n, d, seed=int(d))
        dg = DistGraph(indptr, indices, comm, RuntimeConfig(ps=16, dist=4, wpb=4, backend=args.backend))
        st = degree_stats(fused_aggregation(dg, "additive", True, 0.2, None).plan)
        auto = fused_aggregation(dg, "additive", True, 0.2, None).strategy
        t = {s: time_strategy(dg, s, args.heads, args.channels, args.reps, args.warmup) for s in ("node", "edge")}
        row = {"graph": shape, "avg_degree": st.avg_degree, "max_degree": st.max_degree, "nodes": n,
               "edges": int(indptr[-1]), "node_ms": t["node"], "edge_ms": t["edge"],
               "winner": min(t, key=t.get), "adaptive_pick": auto}
        rows.append(row)
        if comm.rank == 0:
            print(f"{shape:9} avg {st.avg_degree:7.1f} max {st.max_degree:7d}  node {t['node']:9.3f} ms  "
                  f"edge {t['edge']:9.3f} ms  edge/node {t['edge'] / t['node']:6.2f}  winner {row['winner']:4}  "
                  f"adaptive {auto}", flush=True)
        dg.close()
    uni = [r for r in rows if r["graph"] == "uniform"]
    cross = None
    for i, r in enumerate(uni):
        if all(x["winner"] == "node" for x in uni[i:]):
            cross = r["avg_degree"]
            break
    right = sum(r["winner"] == r["adaptive_pick"] for r in rows)
    if comm.rank == 0:
        dev = "gpu" if torch.cuda.is_available() and args.backend != "cpu" else "cpu"
        name = f"gat-threshold-{dev}-P{comm.size}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
        os.makedirs(args.out, exist_ok=True)
        atomic_write_json(os.path.join(args.out, name), {"rows": rows, "crossover_avg_degree": cross,
                                                         "P": comm.size, "args": vars(args),
                                                         "device": torch.cuda.get_device_name() if dev == "gpu" else "cpu"})
        print(f"crossover (node-centric wins from here on): avg degree {cross}; "
              f"adaptive rule picked the faster kernel on {right}/{len(rows)} graphs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
