"""Startup phases on one process: generate, partition, plan (forward + transposed), in seconds.

    python bench/startup.py [--datasets reddit-like products-like] [--scale 0.3] [--parts 1]
                            [--device cpu|cuda] [--threads T]

For every dataset: time to generate the preset (`mgg.data.generators.preset`, on --device where
the generator supports it), to partition it (`partition_ranges`, default beta and beta=0), and to
build every rank's rows and GCN plan for P = --parts in this one process, the way `DistGraph`
does (forward rows + `build_plan`; transposed rows + `build_plan`). Prints one table row per
dataset; `--json PATH` also writes the figures.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.data import generators  # noqa: E402
from mgg.runtime.context import DistGraph  # noqa: E402
from mgg.runtime.partition import partition_ranges  # noqa: E402
from mgg.runtime.plan import PlanParams, build_plan  # noqa: E402
from mgg.runtime.weights import diag_weights, pair_weights  # noqa: E402


def _accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rank_rows(indptr, indices, bounds, rank, transposed, device):
    """A DistGraph's rows for `rank` without a communicator (same methods DistGraph.__init__ calls)."""
    dg = DistGraph.__new__(DistGraph)
    dg.bounds, dg.rank, dg.world_size = bounds, rank, len(bounds) - 1
    dg.lo, dg.hi = int(bounds[rank]), int(bounds[rank + 1])
    dg.plan_device = torch.device(device)
    fn = dg._transposed_rows if transposed else dg._forward_rows
    return dg, fn(indptr, indices)


def _plan(dg, rows, deg_in, bounds, rank, transposed, device):
    if transposed:
        w = pair_weights("gcn", deg_in, rows.indices, rows.row_ids)
    else:
        w = pair_weights("gcn", deg_in, rows.row_ids, rows.indices)
    d = diag_weights("gcn", deg_in, np.arange(dg.lo, dg.hi))
    kw = {"device": device} if _accepts(build_plan, "device") else {}
    return build_plan(rows.indptr, rows.indices, w, d, bounds, rank, PlanParams(), None, **kw)


def measure(name: str, scale: float, parts: int, device: str, seed: int = 0) -> dict:
    out = {"dataset": name, "scale": scale, "parts": parts, "device": device}
    kw = {"device": device} if _accepts(generators.preset, "device") else {}
    _sync(device)
    t = time.perf_counter()
    g = generators.preset(name, scale, seed=seed, **kw)
    _sync(device)
    out["generate_s"] = time.perf_counter() - t
    out["nodes"], out["edges"] = g.num_nodes, g.num_edges
    out["gen_medges_per_s"] = g.num_edges / out["generate_s"] / 1e6
    indptr, indices = g.indptr, g.indices
    t = time.perf_counter()
    bounds = partition_ranges(indptr, parts)
    out["partition_s"] = time.perf_counter() - t
    t = time.perf_counter()
    partition_ranges(indptr, parts, beta=0.0) if _accepts(partition_ranges, "beta") else None
    out["partition_beta0_s"] = time.perf_counter() - t
    deg_in = np.diff(indptr)
    for transposed, key in ((False, "forward"), (True, "transposed")):
        rows_s = plan_s = 0.0
        for r in range(parts):
            _sync(device)
            t = time.perf_counter()
            dg, rows = _rank_rows(indptr, indices, bounds, r, transposed, device)
            _sync(device)
            t1 = time.perf_counter()
            _plan(dg, rows, deg_in, bounds, r, transposed, device)
            _sync(device)
            rows_s += t1 - t
            plan_s += time.perf_counter() - t1
        out[f"{key}_rows_s"], out[f"{key}_plan_s"] = rows_s, plan_s
    out["plans_total_s"] = sum(out[f"{k}_{p}_s"] for k in ("forward", "transposed") for p in ("rows", "plan"))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["reddit-like", "products-like"])
    ap.add_argument("--scale", type=float, default=0.3)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = [measure(d, a.scale, a.parts, a.device) for d in a.datasets]
    cols = ["dataset", "nodes", "edges", "generate_s", "gen_medges_per_s", "partition_s",
            "partition_beta0_s", "forward_rows_s", "forward_plan_s", "transposed_rows_s",
            "transposed_plan_s", "plans_total_s"]
    print(f"device={a.device} threads={torch.get_num_threads()} scale={a.scale} parts={a.parts}")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
