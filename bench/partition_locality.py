"""Locality of mgg's contiguous ranges under each node order, against METIS's own partition (CPU).

    PYTHONPATH=$PWD python bench/partition_locality.py --dataset products-like --scale 1 \\
        [--parts 2,4,8] [--methods none,cluster,metis] [--no-metis-own] [--out FILE.json]

For every node order of `--methods` (mgg.data.reorder; `none` is the input order) the graph is
relabelled in a forked child process (`timed`), which reports the order's seconds and its peak host memory
above the loaded graph (the child's peak RSS minus its RSS at the fork). Then, for every P of
`--parts`, mgg cuts its edge-balanced ranges (`partition_ranges`, the default beta, as training
does) and the table gives the CSR entries whose source lies on another rank (remote edges: the
directed edge cut, summed over ranks) and the distinct remote rows per rank (max and mean: the
rows one halo gather moves). `metis-own` is METIS's own P-way partition of the same graph
(k-way, vertex weight in-degree + 1, not contiguous) measured the same way: the reference the
orders are held against (`vs METIS` = max remote rows / METIS's own max remote rows).
A dataset is a preset name (with --scale) or a graph file (.npz, ...); node data is dropped.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mgg.data import Graph, load_dataset  # noqa: E402
from mgg.data.reorder import METHODS, permutation, permute_graph  # noqa: E402
from mgg.runtime.footprint import array_chunks, footprints_from_chunks  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(fn, args, path: str, conn) -> None:
    start = _rss_mb()
    t0 = time.perf_counter()
    try:
        np.save(path, fn(*args))
        conn.send((time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - start, None))
    except Exception as e:  # noqa: BLE001 - reported by the parent
        conn.send((0.0, 0.0, f"{type(e).__name__}: {e}"))


def timed(fn, *args) -> tuple[np.ndarray, float, float]:
    """(fn(*args), seconds, peak MiB above the parent's RSS at the fork): run in a forked child
    (so each figure is the peak of that call alone) that returns an int64 array."""
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.npy")
        a, b = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, args, path, b))
        p.start()
        seconds, peak, err = a.recv()
        p.join()
        if err:
            raise RuntimeError(f"{getattr(fn, '__name__', fn)}: {err}")
        return np.load(path), seconds, peak


def range_locality(graph: Graph, parts: list[int]) -> dict[int, dict]:
    """{P: remote edges (sum), remote rows per rank (max, mean), nodes and edges per rank (max)} of
    mgg's ranges over `graph`'s order."""
    fps = footprints_from_chunks(graph.indptr, array_chunks(graph.indices, graph.num_edges), parts)
    out = {}
    for p, f in fps.items():
        rows = [r.remote_rows for r in f]
        out[p] = {"remote_edges": int(sum(r.remote_edges for r in f)), "remote_rows_max": int(max(rows)),
                  "remote_rows_mean": float(np.mean(rows)), "nodes_max": int(max(r.nodes for r in f)),
                  "edges_max": int(max(r.edges for r in f))}
    return out


def part_locality(graph: Graph, membership: np.ndarray, p: int) -> dict:
    """The same figures for an arbitrary partition (`membership` int [N] in [0, p))."""
    n = graph.num_nodes
    deg = np.diff(graph.indptr)
    tgt_part = np.repeat(membership, deg)
    src = np.asarray(graph.indices, dtype=np.int64)
    far = membership[src] != tgt_part
    key = np.unique(tgt_part[far].astype(np.int64) * n + src[far])
    rows = np.bincount(key // n, minlength=p)
    return {"remote_edges": int(far.sum()), "remote_rows_max": int(rows.max()), "remote_rows_mean": float(rows.mean()),
            "nodes_max": int(np.bincount(membership, minlength=p).max()),
            "edges_max": int(np.bincount(membership, weights=deg, minlength=p).max())}


def metis_own(graph: Graph, p: int) -> np.ndarray:
    """METIS's k-way partition into `p` parts: membership int64 [N]."""
    import pymetis

    from mgg.data.metis_order import SEED, _metis_adjacency

    xadj, adjncy = _metis_adjacency(graph)
    res = pymetis.part_graph(p, adjacency=pymetis.CSRAdjacency(xadj, adjncy),
                             vweights=np.diff(graph.indptr) + 1, options=pymetis.Options(seed=SEED))
    return np.asarray(res.vertex_part, dtype=np.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="products-like")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--parts", default="2,4,8", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--methods", default="none,cluster,metis", type=lambda s: s.split(","))
    ap.add_argument("--no-metis-own", dest="metis_own", action="store_false")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        ap.error(f"unknown method(s) {bad}; valid: {', '.join(METHODS)}")
    t0 = time.perf_counter()
    g = load_dataset(args.dataset, scale=args.scale, mmap=False)
    g = Graph(np.asarray(g.indptr, dtype=np.int64), np.asarray(g.indices, dtype=np.int64), name=g.name)
    print(f"# {g.name}: N={g.num_nodes:,} E={g.num_edges:,} (loaded in {time.perf_counter() - t0:.1f} s, "
          f"RSS {_rss_mb():,.0f} MiB)", flush=True)
    rows = []
    for m in args.methods:
        perm, sec, peak = (np.arange(g.num_nodes), 0.0, 0.0) if m == "none" else timed(permutation, g, m)
        loc = range_locality(g if m == "none" else permute_graph(g, perm), args.parts)
        rows += [{"order": m, "P": p, "seconds": sec, "peak_mb": peak, **v} for p, v in loc.items()]
        print(f"  {m}: {sec:.1f} s, peak +{peak:,.0f} MiB", flush=True)
    if args.metis_own:
        for p in args.parts:
            memb, sec, peak = timed(metis_own, g, p)
            rows.append({"order": "metis-own", "P": p, "seconds": sec, "peak_mb": peak, **part_locality(g, memb, p)})
            print(f"  metis-own P={p}: {sec:.1f} s, peak +{peak:,.0f} MiB", flush=True)
    own = {r["P"]: r["remote_rows_max"] for r in rows if r["order"] == "metis-own"}
    print(f"\n| order | P | seconds | peak MiB | remote edges (sum) | remote rows max | remote rows mean | vs METIS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        vs = f"{r['remote_rows_max'] / own[r['P']]:.2f}x" if r["P"] in own else "-"
        peak = "-" if r["peak_mb"] is None else f"{r['peak_mb']:,.0f}"
        print(f"| {r['order']} | {r['P']} | {r['seconds']:.1f} | {peak} | {r['remote_edges']:,} | "
              f"{r['remote_rows_max']:,} | {r['remote_rows_mean']:,.0f} | {vs} |")
    if args.out:
        from mgg.atomic import atomic_write_json

        atomic_write_json(args.out, {"dataset": g.name, "num_nodes": g.num_nodes, "num_edges": g.num_edges,
                                     "command": " ".join(["bench/partition_locality.py", *sys.argv[1:]]), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
