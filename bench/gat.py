"""GAT benchmark: mgg's fused, distributed GAT vs PyG GATConv; epoch time and peak memory.

    python bench/gat.py                                   # 1 process: mgg (+ PyG when installed)
    mpirun -np 2 python bench/gat.py --no-pyg             # mgg over P ranks (scaling)
    python bench/gat.py --summarize bench/results/gat-*.json   # P-scaling table of saved runs

Model: the GAT paper's 2 layers, 8 heads x 8 hidden (ELU, concat), last layer 1 head; full-graph
training epochs (forward, cross-entropy on the train mask, backward, Adam step). Graphs:
products-like and reddit-like (mgg.data.generators presets) scaled by --scale-products /
--scale-reddit (average degree kept: 25 and 492). For every graph and strategy (adaptive, or
--strategy node/edge/both to measure both kernels: the input for
mgg.graph.adaptive.NODE_CENTRIC_MIN_AVG_DEGREE) it reports the median epoch time (max over
ranks) and the peak memory: torch.cuda.max_memory_allocated on the GPU, the peak RSS growth of the
process on CPU (a coarse number; PyG's and ours are measured in the same way). With PyG, the
peak-memory ratio PyG / mgg is printed (PyG materialises E x heads x C messages; mgg does not).

Results go to bench/results/gat-<backend>-P<P>-<date>.json (rank 0).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import resource
import socket
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.atomic import atomic_write_json  # noqa: E402
from mgg.data.generators import preset  # noqa: E402
from mgg.graph.adaptive import fused_aggregation  # noqa: E402
from mgg.nn import GAT, allreduce_gradients, broadcast_parameters  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig, resolve_backend  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _Mem:
    """Peak memory of a block: CUDA allocator peak, or growth of the process's peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.base = _rss_mb()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        else:
            self.peak_mb = max(0.0, _rss_mb() - self.base)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_mgg(graph, comm, args, strategy: str | None) -> dict:
    cfg = RuntimeConfig(backend=args.backend)
    dg = DistGraph.build(graph, comm, cfg)
    dev = dg.device
    torch.manual_seed(0)
    model = GAT(graph.x.shape[1], 8, int(graph.y.max()) + 1, layers=2, dropout=0.6).to(dev)
    for conv in model.convs:
        conv.strategy = strategy
    broadcast_parameters(model, comm)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    x = torch.from_numpy(np.ascontiguousarray(dg.local(graph.x))).to(dev)
    y = torch.from_numpy(np.ascontiguousarray(dg.local(graph.y))).to(dev)
    mask = torch.from_numpy(np.ascontiguousarray(dg.local(graph.train_mask))).to(dev)
    n_train = max(1, int(comm.allreduce_scalar(float(mask.sum().item()))))
    gen = torch.Generator().manual_seed(0)
    times = []
    with _Mem(dev) as mem:
        for ep in range(args.warmup + args.epochs):
            comm.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            out = model(x, dg, gen)
            loss = torch.nn.functional.cross_entropy(out[mask], y[mask], reduction="sum") / n_train
            loss.backward()
            allreduce_gradients(model, comm)
            opt.step()
            _sync(dev)
            dt = comm.allreduce_scalar(time.perf_counter() - t0, "max")
            if ep >= args.warmup:
                times.append(dt)
    choice = fused_aggregation(dg, "additive", True, 0.2, strategy).choice.to_dict()
    peak = comm.allreduce_scalar(mem.peak_mb, "max")
    dg.close()
    return {"impl": "mgg", "strategy": strategy or "adaptive", "choice_rank0": choice,
            "epoch_s": float(np.median(times)), "epochs_s": times, "peak_mb": peak}


def run_pyg(graph, args) -> dict | None:
    try:
        from torch_geometric.nn import GATConv as PyGGAT
    except ImportError:
        return None
    dev = torch.device("cuda" if torch.cuda.is_available() and args.backend != "cpu" else "cpu")

    class Net(torch.nn.Module):
        def __init__(self, fin, classes):
            super().__init__()
            self.c1 = PyGGAT(fin, 8, heads=8)
            self.c2 = PyGGAT(64, classes, heads=1, concat=False)

        def forward(self, x, ei):
            x = torch.nn.functional.dropout(x, 0.6, self.training)
            x = torch.nn.functional.elu(self.c1(x, ei))
            x = torch.nn.functional.dropout(x, 0.6, self.training)
            return self.c2(x, ei)

    torch.manual_seed(0)
    model = Net(graph.x.shape[1], int(graph.y.max()) + 1).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    tgt = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    ei = torch.from_numpy(np.stack([graph.indices, tgt])).to(dev)
    x, y = torch.from_numpy(graph.x).to(dev), torch.from_numpy(graph.y).to(dev)
    mask = torch.from_numpy(graph.train_mask).to(dev)
    times = []
    with _Mem(dev) as mem:
        for ep in range(args.warmup + args.epochs):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x, ei)[mask], y[mask])
            loss.backward()
            opt.step()
            _sync(dev)
            if ep >= args.warmup:
                times.append(time.perf_counter() - t0)
    return {"impl": "pyg", "epoch_s": float(np.median(times)), "epochs_s": times, "peak_mb": mem.peak_mb}


def summarize(paths: list[str]) -> None:
    rows = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        for res in r.get("results", ()):  # other gat-*.json files (gat-threshold) have none
            if res["impl"] == "mgg":
                rows.append((res["graph"], res["strategy"], r["backend"], r["P"], res["epoch_s"]))
    base = {(g, s, b): t for g, s, b, P, t in rows if P == 1}
    print(f"{'graph':24} {'strategy':9} {'backend':7} {'P':>3} {'epoch s':>10} {'speedup vs P=1':>15}")
    for g, s, b, P, t in sorted(rows):
        sp = base.get((g, s, b))
        print(f"{g:24} {s:9} {b:7} {P:3d} {t:10.4f} {(sp / t) if sp else float('nan'):15.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale-products", type=float, default=0.002)
    ap.add_argument("--scale-reddit", type=float, default=0.001)
    ap.add_argument("--graphs", default="products-like,reddit-like", help="comma-separated presets to run")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto")
    ap.add_argument("--strategy", choices=["auto", "node", "edge", "both"], default="auto")
    ap.add_argument("--no-pyg", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--summarize", nargs="+", metavar="JSON")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize(sorted({p for pat in args.summarize for p in glob.glob(pat)}))
        return 0
    comm = world()
    strategies = {"auto": [None], "node": ["node"], "edge": ["edge"], "both": ["node", "edge"]}[args.strategy]
    results = []
    scales = {"products-like": args.scale_products, "reddit-like": args.scale_reddit}
    for name in [g for g in args.graphs.split(",") if g]:
        if name not in scales:
            raise SystemExit(f"--graphs: unknown graph {name!r} (choose from {', '.join(scales)})")
        scale = scales[name]
        t_gen = time.perf_counter()
        graph = preset(name, scale, seed=0)
        if comm.rank == 0:
            print(f"{name}@{scale:g}: generated in {time.perf_counter() - t_gen:.1f} s", flush=True)
        label = f"{name}@{scale:g}"
        for st in strategies:
            r = run_mgg(graph, comm, args, st)
            r["graph"] = label
            results.append(r)
            if comm.rank == 0:
                print(f"{label:24} mgg[{r['strategy']}->{r['choice_rank0']['strategy']}] P={comm.size}: "
                      f"epoch {r['epoch_s'] * 1e3:9.1f} ms  peak {r['peak_mb']:9.1f} MB  "
                      f"(avg deg {r['choice_rank0']['avg_degree']:.1f})", flush=True)
        if comm.size == 1 and not args.no_pyg:
            try:
                p = run_pyg(graph, args)
            except torch.cuda.OutOfMemoryError as e:  # a result: PyG materialises E x heads messages
                p = {"impl": "pyg", "error": f"out of memory: {str(e).splitlines()[0][:160]}"}
                torch.cuda.empty_cache()
            if p is None:
                print(f"{label:24} pyg: torch_geometric not installed, skipped")
            elif "error" in p:
                p["graph"] = label
                results.append(p)
                print(f"{label:24} pyg: {p['error']}", flush=True)
            else:
                p["graph"] = label
                results.append(p)
                ours = results[-2]["peak_mb"]
                print(f"{label:24} pyg: epoch {p['epoch_s'] * 1e3:9.1f} ms  peak {p['peak_mb']:9.1f} MB  "
                      f"peak-memory ratio pyg/mgg = {p['peak_mb'] / max(ours, 1e-9):.2f}  "
                      f"time ratio pyg/mgg = {p['epoch_s'] / results[-2]['epoch_s']:.2f}", flush=True)
    if comm.rank == 0:
        backend = resolve_backend(args.backend)
        os.makedirs(args.out, exist_ok=True)
        date = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = os.path.join(args.out, f"gat-{backend}-P{comm.size}-{date}.json")
        atomic_write_json(path, {"host": socket.gethostname(), "platform": platform.platform(), "P": comm.size,
                                 "backend": backend, "torch": torch.__version__, "command": " ".join(sys.argv),
                                 "date": date, "results": results})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
