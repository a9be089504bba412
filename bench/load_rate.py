"""How fast a user's own edge list loads: a PyG-style ``edge_index`` .npz through `load_dataset`
(what `mgg.train --dataset FILE` does), in edges per second, against the textbook CSR build
(bincount + a stable argsort of the targets) and against the CSR file `mgg.prepare` writes.

    python bench/load_rate.py --edges 115000000 --nodes 2450000 [--threads 1,4,16] [--dir DIR]

The file (int64 edge_index [2, E] with uniform random ends, num_nodes) is written once into
--dir (default: a temporary folder) and read back several ways, each timed once after one
warm-up read of the file (the page cache holds it, as it does on a second run):

  * ``load``      load_dataset(FILE): mapped edge_index, packed-key sort on --threads threads
  * ``argsort``   np.load + bincount + argsort(kind="stable"): the build before the packed sort
  * ``csr``       load_dataset(CSR): the memory-mapped CSR file `mgg.prepare FILE --out CSR` writes
                  (its conversion time is printed too)

Prints one line per way with seconds and M edges/s; --json PATH writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mgg.data.edge_sort as edge_sort  # noqa: E402
from mgg.data import load_dataset  # noqa: E402


def write_file(path: str, edges: int, nodes: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    ei = np.empty((2, edges), dtype=np.int64)
    step = 1 << 24
    for a in range(0, edges, step):
        ei[:, a:a + step] = rng.integers(0, nodes, (2, min(step, edges - a)))
    np.savez(path, edge_index=ei, num_nodes=np.int64(nodes))


def argsort_build(path: str):
    with np.load(path) as z:
        ei, n = z["edge_index"], int(z["num_nodes"])
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(ei[1], minlength=n), out=indptr[1:])
    return indptr, ei[0][np.argsort(ei[1], kind="stable")]


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edges", type=int, default=20_000_000)
    p.add_argument("--nodes", type=int, default=2_000_000)
    p.add_argument("--threads", default="", help="comma-separated thread counts for `load` (default: the usable cores)")
    p.add_argument("--dir", default=None)
    p.add_argument("--no-argsort", action="store_true", help="skip the argsort reference (slow at 10^8 edges)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    d = args.dir or tempfile.mkdtemp(prefix="mgg-load-")
    path, csr = os.path.join(d, f"ei-{args.edges}.npz"), os.path.join(d, f"csr-{args.edges}.npz")
    e = args.edges
    if not os.path.exists(path):
        dt, _ = _timed(lambda: write_file(path, e, args.nodes))
        print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB) in {dt:.1f} s", flush=True)
    with open(path, "rb") as f:  # warm the page cache
        while f.read(1 << 26):
            pass
    print(f"{e:,} edges, {args.nodes:,} nodes; {os.cpu_count()} cores, default threads "
          f"{edge_sort.default_threads()}", flush=True)
    rows = {}
    threads = [int(t) for t in args.threads.split(",") if t] or [edge_sort.default_threads()]
    ref = None
    for t in threads:
        edge_sort.default_threads = lambda t=t: t  # noqa: E731 - the loader's thread count
        dt, g = _timed(lambda: load_dataset(path))
        rows[f"load threads={t}"] = {"s": dt, "medges_s": e / dt / 1e6}
        ref = g
    if not args.no_argsort:
        dt, (indptr, indices) = _timed(lambda: argsort_build(path))
        rows["argsort"] = {"s": dt, "medges_s": e / dt / 1e6}
        assert np.array_equal(indptr, ref.indptr) and np.array_equal(indices, ref.indices), "builds differ"
    from mgg.prepare import main as prepare

    if os.path.exists(csr):
        os.remove(csr)
    dt, _ = _timed(lambda: prepare([path, "--out", csr]))
    rows["mgg.prepare FILE --out CSR"] = {"s": dt, "medges_s": e / dt / 1e6}
    dt, g = _timed(lambda: load_dataset(csr))
    rows["csr (mapped)"] = {"s": dt, "medges_s": e / dt / 1e6}
    for name, r in rows.items():
        print(f"{name:30} {r['s']:8.2f} s  {r['medges_s']:8.1f} M edges/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"edges": e, "nodes": args.nodes, "cores": os.cpu_count(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
