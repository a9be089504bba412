"""Where one full-graph training step's GPU time goes, kernel by kernel (torch.profiler).

    python bench/step_kernels.py [--dataset products-like:1] [--models gin:none] [--variant csr_rows]
                                 [--steps 5] [--top 25] [--storage-dtype fp32]

The step is bench/fullgraph.py's (mgg's model, dropout off, the CLI's Adam, the loss rows as the
CLI registers them), on one GPU. For each model it prints the kernels by total CUDA time over
`--steps` profiled steps (after 3 warm-up steps), per step, with their share of the step, and
the step's median wall time: the table that says which part to make faster next.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernel_table(step, steps: int, detail: str = "") -> tuple[list[tuple[str, float, int]], float, list[float]]:
    """([(kernel name, ms per step, launches per step)] by time, step ms, [ms of each launch of
    the last profiled step whose kernel name contains `detail`, in launch order]) of `steps`
    profiled steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            walls.append(a.elapsed_time(b))
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    launches = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time_total / 1e3
            count[ev.name] += 1
            if detail and detail in ev.name:
                launches.append((ev.time_range.start, ev.device_time_total / 1e3))
    rows = sorted(((k, v / steps, count[k] // steps) for k, v in total.items()), key=lambda r: -r[1])
    launches.sort()
    per_step = len(launches) // steps if steps else 0
    return rows, statistics.median(walls), [ms for _, ms in launches[len(launches) - per_step:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="products-like:1")
    ap.add_argument("--models", default="gin:none,gin")
    ap.add_argument("--variant", default="auto")
    ap.add_argument("--storage-dtype", default="fp32")
    ap.add_argument("--no-input-cache", dest="input_cache", action="store_false",
                    help="the first layer aggregates its input every step (mgg.nn.input_cache off)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="the models' dropout (default 0, as bench/fullgraph.py; the CLI trains GCN with 0.5)")
    ap.add_argument("--fold", choices=("on", "off", "both"), default="on",
                    help="GNN.fold_input_scale (the gcn factor folded into the dropout; needs --dropout > 0); "
                         "both: each model with it on, then off")
    ap.add_argument("--epilogue", choices=("on", "off", "both"), default="on",
                    help="GNN.fuse_epilogue (a hidden GCN layer's bias, ReLU and the next dropout in one "
                         "pass, mgg.nn.epilogue); both: each model with it on, then off")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--detail", default="", help="also print each launch (ms, in order) of the kernels "
                    "whose name contains this, e.g. csr_rows")
    ap.add_argument("--cache", default=os.environ.get("MGG_BENCH_CACHE", "/tmp/mgg-graphs"))
    args = ap.parse_args()

    import torch

    from bench.harness.workloads import build_bench_model, epoch_fn, load_graph, model_spec, parse_dataset
    from mgg.apps.loop import ROW_SET_MAX_SHARE
    from mgg.nn.optim import Adam
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig

    comm = world()
    device = torch.device("cuda", 0)
    name, scale, order = parse_dataset(args.dataset)
    g = load_graph(name, scale, args.cache, comm, order)
    dg = DistGraph.build(g, comm, RuntimeConfig(backend="gpu", storage_dtype=args.storage_dtype))
    if args.variant != "auto":
        dg.set_variant(args.variant)
    models = args.models.split(",")
    layers = max(model_spec(m)["layers"] for m in models)
    sets = dg.register_layer_rows("train", np.nonzero(dg.local(g.train_mask))[0], layers, ROW_SET_MAX_SHARE)
    dg.bench_train_rows = sets if sets[-1] is not None else None
    x = torch.from_numpy(np.ascontiguousarray(dg.local(g.x))).to(device)
    y = torch.from_numpy(np.ascontiguousarray(dg.local(g.y))).to(device)
    tm = torch.from_numpy(np.ascontiguousarray(dg.local(g.train_mask))).to(device)
    choice = {"on": (True,), "off": (False,), "both": (True, False)}
    for mname, fold, epi in ((m, f, e) for m in models for f in choice[args.fold] for e in choice[args.epilogue]):
        torch.manual_seed(0)
        model = build_bench_model(mname, g, device, args.input_cache)
        model.dropout, model.fold_input_scale, model.fuse_epilogue = float(args.dropout), fold, epi
        opt = Adam(model.parameters(), lr=0.01)
        rows, wall, launches = kernel_table(epoch_fn(model, dg, x, y, tm, float(g.train_mask.sum()), opt, comm),
                                            args.steps, args.detail)
        busy = sum(r[1] for r in rows)
        print(f"== {name} {mname} ({args.storage_dtype}, variant {args.variant}, dropout {args.dropout:g}"
              f"{'' if fold else ', no fold'}{'' if epi else ', no epilogue'}): step {wall:.2f} ms, "
              f"kernels {busy:.2f} ms, {sum(r[2] for r in rows)} launches")
        for k, ms, n in rows[: args.top]:
            print(f"  {ms:8.3f} ms {100 * ms / busy:5.1f}%  x{n:<4d} {k[:110]}")
        if args.detail:
            print(f"  launches of *{args.detail}* in one step (ms): " + " ".join(f"{ms:.3f}" for ms in launches))
        del model, opt
        torch.cuda.empty_cache()
    dg.close()  # the symmetric arrays, before NVSHMEM finalizes at exit


if __name__ == "__main__":
    main()
