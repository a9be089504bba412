"""Startup phases on one process: generate, load .npz, partition, rows and plans, in seconds.

    python bench/startup.py [--datasets reddit-like products-like] [--scale 0.3] [--parts 1]
                            [--device cpu|cuda] [--threads T] [--npz-dir DIR] [--json PATH]

For every dataset: time to generate the preset (on --device where the generator supports it),
to load it back from a saved `.npz` (`mgg.data.npz.load_npz`; the file is written to --npz-dir,
default a temporary folder, and reused when it exists), to partition it (`partition_ranges`,
default beta, and beta=0 for reference), then for every rank of P = --parts in this one process,
the way `DistGraph` does on its plan device (--device): forward rows, transposed rows, the forward
and transposed GCN plans, and the reweighted plans of every other kind (sum, mean; both
directions). `load_to_plans_s` = load + partition + rows + plans + reweights: the startup goal
(reddit-like, one H200: <= 1.5 s). Prints one table row per dataset; `--json PATH` also writes
the figures.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.data import generators  # noqa: E402
from mgg.data.npz import load_npz, save_npz  # noqa: E402
from mgg.graph.dist_graph import DistGraph, RuntimeConfig  # noqa: E402
from mgg.graph.rank_rows import host_tensor  # noqa: E402
from mgg.runtime.partition import partition_ranges  # noqa: E402

EXTRA_KINDS = ("sum", "mean")


def _accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


class _Clock:
    """Wall seconds of a phase, the device synchronised at both ends."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.s = time.perf_counter() - self.t


def _rank_graph(indptr, bounds, rank, device) -> DistGraph:
    """A DistGraph shell for `rank` without a communicator or store: the attributes its row and
    plan methods read, set as DistGraph.__init__ sets them."""
    dg = DistGraph.__new__(DistGraph)
    dg.config = RuntimeConfig(backend="cpu")
    dg.bounds, dg.rank, dg.world_size = bounds, rank, len(bounds) - 1
    dg.lo, dg.hi = int(bounds[rank]), int(bounds[rank + 1])
    dg.num_nodes = len(indptr) - 1
    dg.deg_in = np.diff(indptr)
    dg.node_of_pe = np.zeros(dg.world_size, np.int32)
    dg.plan_device = dg.device = torch.device(device)
    dg._deg_t = torch.from_numpy(dg.deg_in).to(dg.plan_device)
    dg.params = dg.config.params
    dg._plans = {}
    return dg


def measure(name: str, scale: float, parts: int, device: str, npz_dir: str, seed: int = 0,
            generate: bool = True) -> dict:
    out = {"dataset": name, "scale": scale, "parts": parts, "device": device}
    path = os.path.join(npz_dir, f"{name}@{scale:g}-s{seed}.npz")
    if generate or not os.path.exists(path):
        kw = {"device": device} if _accepts(generators.preset, "device") else {}
        with _Clock(device) as c:
            g = generators.preset(name, scale, seed=seed, **kw)
        out["generate_s"] = c.s
        out["gen_medges_per_s"] = g.num_edges / c.s / 1e6
        if not os.path.exists(path):
            save_npz(g, path)
        del g
    with _Clock(device) as c:
        g = load_npz(path)
    out["load_npz_s"] = c.s
    out["nodes"], out["edges"] = g.num_nodes, g.num_edges
    indptr, indices = g.indptr, g.indices
    with _Clock(device) as c:
        bounds = partition_ranges(indptr, parts)
    out["partition_s"] = c.s
    with _Clock(device) as c:
        partition_ranges(indptr, parts, beta=0.0)
    out["partition_beta0_s"] = c.s
    keys = ["upload", "forward_rows", "transposed_rows", "forward_plan", "transposed_plan"]
    keys += [f"reweight_{k}" for k in EXTRA_KINDS]
    acc = dict.fromkeys(keys, 0.0)
    for r in range(parts):
        dg = _rank_graph(indptr, bounds, r, device)
        with _Clock(device) as c:
            if dg.plan_device.type != "cpu":
                ip_d, ind_d = (host_tensor(a).to(dg.plan_device) for a in (indptr, indices))
            else:
                ip_d, ind_d = indptr, indices
        acc["upload"] += c.s
        with _Clock(device) as c:
            dg._fwd = dg._forward_rows(ip_d, ind_d)
        acc["forward_rows"] += c.s
        with _Clock(device) as c:
            dg._bwd = dg._transposed_rows(ip_d, ind_d)
        acc["transposed_rows"] += c.s
        del ip_d, ind_d
        with _Clock(device) as c:
            dg.plan("gcn", False)
        acc["forward_plan"] += c.s
        with _Clock(device) as c:
            dg.plan("gcn", True)
        acc["transposed_plan"] += c.s
        for k in EXTRA_KINDS:
            with _Clock(device) as c:
                dg.plan(k, False)
                dg.plan(k, True)
            acc[f"reweight_{k}"] += c.s
    out.update({f"{k}_s": v for k, v in acc.items()})
    out["plans_total_s"] = sum(acc.values())
    out["load_to_plans_s"] = out["load_npz_s"] + out["partition_s"] + out["plans_total_s"]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["reddit-like", "products-like"])
    ap.add_argument("--scale", type=float, default=0.3)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--npz-dir", default=None, help="where the .npz files go (default: a temp folder)")
    ap.add_argument("--no-generate", action="store_true", help="reuse the .npz in --npz-dir if present")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        d = a.npz_dir or tmp
        os.makedirs(d, exist_ok=True)
        if a.device.startswith("cuda"):  # context creation is not a startup phase of the plan
            torch.zeros(1, device=a.device)
            torch.cuda.synchronize()
        rows = [measure(n, a.scale, a.parts, a.device, d, generate=not a.no_generate) for n in a.datasets]
    cols = ["dataset", "nodes", "edges", "generate_s", "gen_medges_per_s", "load_npz_s", "partition_s",
            "partition_beta0_s", "upload_s", "forward_rows_s", "transposed_rows_s", "forward_plan_s",
            "transposed_plan_s"] + [f"reweight_{k}_s" for k in EXTRA_KINDS] + ["plans_total_s", "load_to_plans_s"]
    print(f"device={a.device} threads={torch.get_num_threads()} scale={a.scale} parts={a.parts}")
    for r in rows:
        for c in cols:
            v = r.get(c, "-")
            print(f"  {c:>20}: {v:.3f}" if isinstance(v, float) else f"  {c:>20}: {v}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
