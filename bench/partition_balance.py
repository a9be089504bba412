"""Per-rank times on the CPU path with edge-only ranges (beta = 0) and the cost-balanced partition.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 \\
        python bench/partition_balance.py [--nodes 200000] [--degree 12] [--dim 64] [--iters 10]

Builds a degree-sorted power-law graph (in-degrees LogNormal(0, sigma) apportioned to E edges and
sorted in decreasing order, so the low ids hold the hubs; sources uniform), then for each
partition -- `beta=0` (Algorithm 1, edges only) and the default beta (`partition_beta=None`) --
builds a DistGraph and times, per rank, after one barrier: K = `--iters` GCN aggregations of a
[n_local, dim] float32 block, then K dense [dim, dim] layers with ReLU (local work only: it
grows with the rank's nodes), then a barrier. An aggregation is collective (its one-sided reads
wait for the owners), so its per-rank time includes waiting for the slowest rank; the dense time
is the rank's own. Rank 0 prints, per partition, nodes and edges per rank (min/max, max over the
even share), aggregation and dense seconds per iteration (min/max over ranks) and the wall time
per iteration (barrier to barrier, the slowest rank sets it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.runtime import world  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig  # noqa: E402


def degree_sorted_powerlaw(n: int, degree: float, sigma: float = 1.6, seed: int = 0):
    """int64 (indptr [n + 1], indices [E]): E = n * degree edges, in-degrees heavy-tailed and
    decreasing with the node id, sources uniform over [0, n) (the same on every rank)."""
    rng = np.random.default_rng(seed)
    w = np.sort(rng.lognormal(0.0, sigma, size=n))[::-1]
    e = int(n * degree)
    deg = np.floor(w * (e / w.sum())).astype(np.int64)
    deg[: e - int(deg.sum())] += 1
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    return indptr, rng.integers(0, n, size=e, dtype=np.int64)


def run(indptr, indices, comm, beta, dim: int, iters: int) -> dict:
    cfg = RuntimeConfig(backend="cpu", partition_beta=beta)
    with DistGraph(indptr, indices, comm, cfg) as dg:
        g = torch.Generator().manual_seed(dg.rank)
        x = torch.randn(dg.n_local, dim, generator=g)
        w = torch.randn(dim, dim, generator=g) / dim ** 0.5
        dg.aggregate(x, "gcn")  # warm-up: plan, executor, symmetric buffer
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            h = dg.aggregate(x, "gcn")
        t1 = time.perf_counter()
        for _ in range(iters):
            h = torch.relu(x @ w)
        t2 = time.perf_counter()
        comm.barrier()
        t3 = time.perf_counter()
        del h
        edges = int(indptr[dg.hi] - indptr[dg.lo])
        return {"nodes": dg.n_local, "edges": edges, "agg": (t1 - t0) / iters,
                "dense": (t2 - t1) / iters, "wall": (t3 - t0) / iters}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--degree", type=float, default=12.0)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    comm = world()
    indptr, indices = degree_sorted_powerlaw(a.nodes, a.degree)
    rows = []
    for label, beta in (("beta=0 (Algorithm 1)", 0.0), ("default beta", None)):
        per = comm.allgather(run(indptr, indices, comm, beta, a.dim, a.iters))
        rows.append((label, per))
    if comm.rank == 0:
        n, e, p = a.nodes, int(indptr[-1]), comm.size
        print(f"degree-sorted power law: N={n} E={e} P={p} dim={a.dim} iters={a.iters} "
              f"(seconds per iteration)")
        print("partition | nodes min/max (max/mean) | edges min/max (max/mean) | aggregation s min/max | "
              "dense s min/max | wall s/iter | per-rank aggregation+dense s")
        for label, per in rows:
            nodes = np.array([r["nodes"] for r in per])
            edges = np.array([r["edges"] for r in per])
            agg = np.array([r["agg"] for r in per])
            dense = np.array([r["dense"] for r in per])
            wall = max(r["wall"] for r in per)
            print(f"{label} | {nodes.min()}/{nodes.max()} ({nodes.max() / (n / p):.2f}x) | "
                  f"{edges.min()}/{edges.max()} ({edges.max() / (e / p):.2f}x) | "
                  f"{agg.min():.4f}/{agg.max():.4f} | {dense.min():.5f}/{dense.max():.5f} | {wall:.4f} | "
                  + " ".join(f"{v:.4f}" for v in agg + dense))

if __name__ == "__main__":
    main()
