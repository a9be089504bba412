"""Full-graph training benchmark: mgg's kernels against the baselines, side by side in one run.

    mpirun -np P python bench/fullgraph.py [--datasets reddit-like:1,products-like:1,papers-like:0.02]
                                           [--models gcn,gin] [--epochs 5] [--warmup 2]

Per dataset and model (GCN 2x16, GIN 5x64, as in MGG §7) it times one training epoch (forward,
backward, gradient all-reduce, Adam step; dropout off for every system) of
  * mgg with each kernel variant (pipelined, pipelined_2pass, ptr, halo, nonpipelined = baseline b),
  * baseline (a): NCCL all-to-all of the halo rows, then torch sparse CSR SpMM (bench/baselines.py),
  * with P = 1 only: baseline (c) torch sparse CSR on one GPU and (d) PyG GCNConv/GINConv,
and, for each variant, the aggregation kernel alone at the model's width against its floor:
local bytes / HBM bandwidth + remote bytes / NVLink bandwidth, both bandwidths measured in the
same run (a device-to-device copy, and a copy from GPU 0 to GPU 1). Medians over epochs.
Results go to bench/results/fullgraph-<gpu>-P<P>-<date>.json; `--summarize FILES` prints the
combined table (speedups against P = 1 and the baselines).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import os
import socket
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("pipelined", "pipelined_2pass", "ptr", "halo", "nonpipelined", "paper")


def model_spec(name: str) -> dict:
    """hidden, layers and aggregation kind of model `name`, from the model registry (mgg.nn.registry);
    SystemExit for a model whose aggregation does not run through the plan (nothing to compare)."""
    from mgg.nn.registry import model_entry, tunable_models

    try:
        e = model_entry(name)
    except ValueError as err:
        raise SystemExit(f"bench/fullgraph.py: --models: {err}") from None
    if e.aggregation is None:
        raise SystemExit(f"bench/fullgraph.py: --models {name}: its aggregation does not run through the plan; "
                         f"choose from {', '.join(tunable_models())}")
    return dict(hidden=e.defaults.hidden, layers=e.defaults.layers, kind=e.aggregation)


def log(comm, *a):
    if comm.rank == 0:
        print(*a, flush=True)


def load_graph(name: str, scale: float, cache: str, comm):
    """Generate once (rank 0), cache as .npz, load on every rank."""
    from mgg.data import load_dataset, load_npz, save_npz

    path = os.path.join(cache, f"{name}-{scale:g}.npz")
    if comm.rank == 0 and not os.path.exists(path):
        t = time.perf_counter()
        g = load_dataset(name, scale=scale, seed=0)
        print(f"  generated {name} scale {scale:g}: {g.num_nodes} nodes {g.num_edges} edges "
              f"in {time.perf_counter() - t:.1f} s", flush=True)
        os.makedirs(cache, exist_ok=True)
        save_npz(g, path)
    comm.barrier()
    return load_npz(path, name=name)


def cuda_ms(fn, reps: int, comm, sync_all=True) -> list[float]:
    import torch

    out = []
    for _ in range(reps):
        comm.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if sync_all:
            comm.barrier()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def bandwidths(comm) -> dict:
    """HBM (device copy, read + write bytes) and NVLink (GPU0 -> GPU1 copy) in GB/s."""
    import torch

    n = 1 << 28  # 1 GiB of float32
    a = torch.empty(n, device="cuda").uniform_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    t = statistics.median(cuda_ms(lambda: b.copy_(a), 10, comm, sync_all=False))
    res = {"hbm_GBps": 2 * 4 * n / t / 1e6}
    del b
    if torch.cuda.device_count() > 1:
        src = torch.cuda.current_device()
        dst = (src + 1) % torch.cuda.device_count()
        c = torch.empty(n, device=f"cuda:{dst}")
        for _ in range(3):
            c.copy_(a)
        def peer():
            c.copy_(a)
            torch.cuda.synchronize(dst)
        t = statistics.median(cuda_ms(peer, 10, comm, sync_all=False))
        res["nvlink_GBps"] = 4 * n / t / 1e6
        del c
    del a
    torch.cuda.empty_cache()
    return res


def epoch_fn(model, G, x, y, train_mask, n_train, opt, comm):
    import torch.nn.functional as F

    from mgg.nn import allreduce_gradients

    def step():
        opt.zero_grad(set_to_none=False)
        out = model(x, G, None)
        loss = F.cross_entropy(out[train_mask], y[train_mask], reduction="sum") / n_train
        loss.backward()
        if comm.size > 1:
            allreduce_gradients(model, comm)
        opt.step()
    return step


def time_system(build_G, mname, g, comm, args, device):
    """Median epoch ms of model `mname` over graph wrapper G (None when out of memory)."""
    import torch

    from mgg.nn import build_model

    m = model_spec(mname)
    try:
        G = build_G()
        x = torch.from_numpy(np.ascontiguousarray(G.local(g.x))).to(device)
        y = torch.from_numpy(np.ascontiguousarray(G.local(g.y))).to(device)
        tm = torch.from_numpy(np.ascontiguousarray(G.local(g.train_mask))).to(device)
        n_train = float(g.train_mask.sum())
        torch.manual_seed(0)
        model = build_model(mname, g.x.shape[1], m["hidden"], int(g.y.max()) + 1, m["layers"], 0.0).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        step = epoch_fn(model, G, x, y, tm, n_train, opt, comm)
        cuda_ms(step, args.warmup, comm)
        ms = statistics.median(cuda_ms(step, args.epochs, comm))
        err = None
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return ms, err


def pyg_epoch(g, mname, args, device, comm):
    import torch
    import torch.nn.functional as F

    try:
        from torch_geometric.nn import GCNConv, GINConv
    except ImportError:
        return None, "torch_geometric not installed"
    if mname not in ("gcn", "gin"):
        return None, f"no PyG baseline for {mname}"
    m = model_spec(mname)
    try:
        ei = torch.from_numpy(g.edge_index()).to(device)
        x = torch.from_numpy(g.x).to(device)
        y = torch.from_numpy(g.y).to(device)
        tm = torch.from_numpy(g.train_mask).to(device)
        C = int(g.y.max()) + 1
        dims = [g.x.shape[1]] + [m["hidden"]] * (m["layers"] - 1) + [C]
        if mname == "gcn":
            convs = [GCNConv(a, b, cached=True) for a, b in zip(dims[:-1], dims[1:])]
        else:
            convs = [GINConv(torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, b)),
                             train_eps=True) for a, b in zip(dims[:-1], dims[1:])]
        convs = torch.nn.ModuleList(convs).to(device)
        opt = torch.optim.Adam(convs.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            h = x
            for i, c in enumerate(convs):
                h = c(h, ei)
                if i < len(convs) - 1:
                    h = h.relu()
            F.cross_entropy(h[tm], y[tm]).backward()
            opt.step()
        cuda_ms(step, args.warmup, comm, sync_all=False)
        ms, err = statistics.median(cuda_ms(step, args.epochs, comm, sync_all=False)), None
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return ms, err


def agg_floor(dg, kind, dim, bw, comm, reps=20):
    """Per variant: aggregation ms, bytes moved, floor ms, achieved GB/s (max over ranks)."""
    import torch

    p = dg.plan(kind)
    dp = max(4, (dim + 3) // 4 * 4)
    x = torch.randn(dg.n_local, dim, device=dg.device)
    rows = []
    for v in VARIANTS:
        dg.set_variant(v)
        dg.aggregate(x, kind)
        ms = statistics.median(cuda_ms(lambda: dg.aggregate(x, kind), reps, comm))
        remote_rows = p.halo_size if v == "halo" else p.num_remote_edges
        local_b = (p.num_local_edges + (p.halo_size if v == "halo" else 0)) * dp * 4 + p.n_local * dp * 4 * 2
        remote_b = remote_rows * dp * 4
        floor = local_b / (bw["hbm_GBps"] * 1e6) + (remote_b / (bw["nvlink_GBps"] * 1e6) if remote_b else 0.0)
        ms_max = comm.allreduce_scalar(ms, "max")
        fl_max = comm.allreduce_scalar(floor, "max")
        rows.append({"variant": v, "agg_ms": ms_max, "floor_ms": fl_max,
                     "bytes": comm.allreduce_scalar(float(local_b + remote_b), "max"),
                     "GBps": (local_b + remote_b) / (ms_max * 1e6)})
    dg.set_variant("pipelined")
    return rows


def run(args) -> None:
    import torch

    from mgg.runtime import DistGraph, RuntimeConfig, world

    comm = world()
    torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    P = comm.size
    if P > 1 and args.nccl:
        import torch.distributed as tdist

        addr = comm.bcast(socket.gethostbyname(socket.gethostname()) if comm.rank == 0 else None)
        port = comm.bcast(29500 + int(time.time()) % 1000 if comm.rank == 0 else None)
        tdist.init_process_group("nccl", init_method=f"tcp://{addr}:{port}", rank=comm.rank, world_size=P,
                                 device_id=device)
    bw = bandwidths(comm)
    if "nvlink_GBps" not in bw:
        bw["nvlink_GBps"] = float("nan")
    log(comm, f"P={P} GPU={torch.cuda.get_device_name()} HBM copy {bw['hbm_GBps']:.0f} GB/s, "
              f"GPU0->GPU1 copy {bw['nvlink_GBps']:.0f} GB/s")
    results = {"gpu": torch.cuda.get_device_name(), "P": P, "command": " ".join(sys.argv),
               "date": _dt.datetime.now().isoformat(timespec="seconds"), "bandwidth": bw, "runs": []}
    from bench.baselines import NcclHaloGraph, SingleGpuGraph

    for spec in args.datasets.split(","):
        name, _, sc = spec.partition(":")
        g = load_graph(name, float(sc or 1), args.cache, comm)
        t = time.perf_counter()
        dg = DistGraph.build(g, comm, RuntimeConfig(args.ps, args.dist, args.wpb, backend="gpu"))
        for kind in sorted({"gcn"} | {model_spec(mn)["kind"] for mn in args.models.split(",")}):
            dg.plan(kind), dg.plan(kind, True)
        dg.num_nodes = g.num_nodes
        from mgg.kernels.gpu import choose_variant

        log(comm, f"== {name} scale {sc}: N={g.num_nodes} E={g.num_edges} F={g.x.shape[1]}; plans "
                  f"{time.perf_counter() - t:.1f} s; rank0 {dg.plan('gcn').stats()}; "
                  f"auto variant: {choose_variant(dg.plan('gcn'))}")
        for mname in args.models.split(","):
            m = model_spec(mname)
            row = {"dataset": name, "scale": float(sc or 1), "nodes": g.num_nodes, "edges": g.num_edges,
                   "model": mname, "systems": {}, "errors": {}}
            for v in VARIANTS:
                dg.set_variant(v)
                ms, err = time_system(lambda: dg, mname, g, comm, args, device)
                row["systems"][f"mgg-{v}"] = ms
                if err:
                    row["errors"][f"mgg-{v}"] = err
            dg.set_variant("pipelined")
            if P > 1 and args.nccl:
                nccl_G = [None]

                def mk():
                    nccl_G[0] = NcclHaloGraph(dg, kinds=(m["kind"],))
                    nccl_G[0].num_nodes = g.num_nodes
                    return nccl_G[0]
                ms, err = time_system(mk, mname, g, comm, args, device)
                row["systems"]["nccl-halo+spmm"] = ms
                if err:
                    row["errors"]["nccl-halo+spmm"] = err
                nccl_G[0] = None
            if P == 1:
                def mk1():
                    s = SingleGpuGraph(g, device, kinds=(m["kind"],))
                    s.num_nodes = g.num_nodes
                    return s
                ms, err = time_system(mk1, mname, g, comm, args, device)
                row["systems"]["torch-sparse-1gpu"] = ms
                if err:
                    row["errors"]["torch-sparse-1gpu"] = err
                ms, err = pyg_epoch(g, mname, args, device, comm) if args.pyg else (None, "skipped")
                row["systems"]["pyg-1gpu"] = ms
                if err:
                    row["errors"]["pyg-1gpu"] = err
            row["aggregation"] = agg_floor(dg, m["kind"], m["hidden"], bw, comm)
            row["systems"] = {k: (comm.allreduce_scalar(v, "max") if v is not None else None)
                              for k, v in row["systems"].items()}
            results["runs"].append(row)
            log(comm, json.dumps({k: row[k] for k in ("dataset", "model", "systems", "errors")}))
        dg.close()
        del g
    if comm.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        gpu = results["gpu"].replace(" ", "_").replace("/", "_")
        path = os.path.join(args.out, f"fullgraph-{gpu}-P{P}-{_dt.datetime.now():%Y%m%d-%H%M%S}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
        print_table([results])
    if P > 1 and args.nccl:
        import torch.distributed as tdist

        tdist.destroy_process_group()


def fmt(v):
    return "-" if v is None else f"{v:.2f}"


def print_table(docs: list[dict]) -> None:
    """One table: epoch ms per system, speedups vs baselines and vs our P=1, aggregation vs floor."""
    one = {}
    for d in docs:
        if d["P"] == 1:
            for r in d["runs"]:
                one[(r["dataset"], r["model"])] = r["systems"]
    print("\nepoch ms (median) | speedups of mgg-pipelined and of the best mgg variant over each system")
    for d in sorted(docs, key=lambda d: d["P"]):
        for r in d["runs"]:
            s = r["systems"]
            ours = s.get("mgg-pipelined")
            best = min((v for k, v in s.items() if k.startswith("mgg-") and v), default=None)
            base = one.get((r["dataset"], r["model"]), {})
            cells = [f"{k}={fmt(v)}" for k, v in s.items()]
            base_best = min((v for k, v in base.items() if k.startswith("mgg-") and v), default=None)
            for label, t in (("pipelined", ours), ("best", best)):
                if not t:
                    continue
                sp = [f"x{s[k] / t:.2f} vs {k}" for k in ("nccl-halo+spmm", "mgg-nonpipelined",
                                                           "torch-sparse-1gpu", "pyg-1gpu") if s.get(k)]
                if d["P"] > 1 and label == "best" and base_best:
                    sp.append(f"x{base_best / t:.2f} vs best P=1")
                if sp:
                    cells.append(f"[{label}: " + ", ".join(sp) + "]")
            print(f"P={d['P']} {r['dataset']:>14} {r['model']}: best mgg {fmt(best)} | " + "  ".join(cells))
            for e, msg in r.get("errors", {}).items():
                print(f"      {e}: {msg}")
            for a in r.get("aggregation", []):
                print(f"      agg {a['variant']:>15}: {a['agg_ms']:.3f} ms, floor {a['floor_ms']:.3f} ms "
                      f"({a['floor_ms'] / a['agg_ms'] * 100:.0f}% of floor speed), {a['GBps']:.0f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1,papers-like:0.02")
    ap.add_argument("--models", default="gcn,gin")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ps", type=int, default=16)
    ap.add_argument("--dist", type=int, default=4)
    ap.add_argument("--wpb", type=int, default=4)
    ap.add_argument("--no-nccl", dest="nccl", action="store_false")
    ap.add_argument("--no-pyg", dest="pyg", action="store_false")
    ap.add_argument("--cache", default=os.environ.get("MGG_BENCH_CACHE", "/tmp/mgg-graphs"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--summarize", nargs="*", default=None, help="print the table of these result files")
    args = ap.parse_args()
    if args.summarize is not None:
        files = [f for pat in (args.summarize or [os.path.join(args.out, "fullgraph-*.json")]) for f in glob.glob(pat)]
        print_table([json.load(open(f)) for f in sorted(files)])
        return
    run(args)


if __name__ == "__main__":
    main()
