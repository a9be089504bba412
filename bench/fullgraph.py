"""Full-graph training benchmark: mgg's kernels against the baselines, side by side in one run.

    mpirun -np P python bench/fullgraph.py [--datasets reddit-like:1,products-like:1,papers-like:0.02]
                                           [--models gcn,gin] [--epochs 5] [--warmup 2]

A dataset is name[:scale[:order]]; an order (degree, rcm, cluster: mgg.data.reorder) relabels the
generated graph once before it is cached and partitioned, and its rows are named name+order
(e.g. products-like:1:cluster -> products-like+cluster).

Per dataset and model (GCN 2x16, GIN 5x64, as in MGG §7; `gin` is mgg's default GIN with batch
norm in its MLP, and every baseline then has the same BatchNorm1d; `gin:none` is GIN without a
norm) it times one training epoch (forward,
backward, gradient all-reduce, Adam step; dropout off for every system) of
  * mgg with each kernel variant (pipelined, pipelined_2pass, ptr, halo, nonpipelined = baseline b),
  * baseline (a): NCCL all-to-all of the halo rows, then torch sparse CSR SpMM (bench/baselines.py),
  * with P = 1 only: the plain torch model a user would write (torch sparse CSR SpMM, the first
    Linear before the aggregation: `torch-plain-1gpu`), baseline (c) mgg's model over torch
    sparse CSR on one GPU, and (d) PyG GCNConv/GINConv,
and, for each variant, the aggregation kernel alone at the model's width against two floors:
compulsory HBM bytes (an index per edge, row pointers, each distinct source row once, self rows,
output) / HBM bandwidth + remote bytes / NVLink bandwidth, and gathered bytes / the rate a bare
gather-sum kernel gets on the plan's own source-index stream at the same width (its L1/L2 reuse
included), measured in the same run.
Bandwidths: a device-to-device copy, a copy from GPU 0 to GPU 1. Medians over epochs.
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
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness.floors import agg_floor, floor_note  # noqa: E402
from bench.harness.systems import plain_torch_epoch, pyg_epoch, time_system  # noqa: E402
from bench.harness.timing import bandwidths, log  # noqa: E402
from bench.harness.workloads import (epoch_traffic, load_graph, model_spec, parse_dataset,  # noqa: E402
                                     variant_list, variants_for)


def run(args) -> None:
    import torch

    from mgg.apps.loop import ROW_SET_MAX_SHARE
    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig

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

    user_tall_gemm = os.environ.get("MGG_TALL_GEMM")  # what a "+cublas" row overrides for itself
    for spec in args.datasets.split(","):
        name, scale, order = parse_dataset(spec)
        g = load_graph(name, scale, args.cache, comm, order)
        name, sc = g.name, scale
        t = time.perf_counter()
        dg = DistGraph.build(g, comm, RuntimeConfig(args.ps, args.dist, args.wpb, backend="gpu"))
        layers = max(model_spec(mn)["layers"] for mn in args.models.split(","))
        sets = dg.register_layer_rows("train", np.nonzero(dg.local(g.train_mask))[0], layers,
                                      ROW_SET_MAX_SHARE)  # as `mgg.train` does
        dg.bench_train_rows = sets if sets[-1] is not None else None
        for kind in sorted({"gcn"} | {model_spec(mn)["kind"] for mn in args.models.split(",")}):
            dg.plan(kind), dg.plan(kind, True)
        dg.num_nodes = g.num_nodes
        from mgg.kernels.gpu import choose_variant

        log(comm, f"== {name} scale {sc}: N={g.num_nodes} E={g.num_edges} F={g.x.shape[1]}; plans "
                  f"{time.perf_counter() - t:.1f} s; rank0 {dg.plan('gcn').stats()}; "
                  f"auto variant: {choose_variant(dg.plan('gcn'))}")
        for mname in args.models.split(","):
            m = model_spec(mname)
            if m["cublas"]:
                os.environ["MGG_TALL_GEMM"] = "0"
            elif user_tall_gemm is None:
                os.environ.pop("MGG_TALL_GEMM", None)
            else:
                os.environ["MGG_TALL_GEMM"] = user_tall_gemm
            row = {"dataset": name, "scale": float(sc or 1), "nodes": g.num_nodes, "edges": g.num_edges,
                   "model": mname, "systems": {}, "errors": {}}
            try:  # an accounting failure must not cost the timings below (it raises the same on every rank)
                traffic = epoch_traffic(dg, mname, g, comm, device, args.input_cache != "off")
                nv_bytes = comm.allreduce_scalar(float(traffic["nvlink_bytes"]), "max")
                row["traffic"] = {"aggregations": traffic["calls"], "nvlink_bytes_max_rank": nv_bytes,
                                  "nvlink_floor_ms": nv_bytes / (bw["nvlink_GBps"] * 1e6) if P > 1 else 0.0}
            except Exception as e:  # noqa: BLE001
                row["errors"]["traffic"] = f"{type(e).__name__}: {e}"
            torch.cuda.reset_peak_memory_stats(device)
            for v in variants_for(dg, args.variants):
                dg.set_variant(v)
                graph_row = {} if args.cuda_graph else None
                ms, err = time_system(lambda: dg, mname, g, comm, args, device, graph_row)
                row["systems"][f"mgg-{v}"] = ms
                if err:
                    row["errors"][f"mgg-{v}"] = err
                if graph_row:
                    row["systems"][f"mgg-{v}+cudagraph"] = graph_row["ms"]
                    if graph_row["error"]:
                        row["errors"][f"mgg-{v}+cudagraph"] = graph_row["error"]
                if args.input_cache == "both":  # the same variant aggregating the input every step
                    ms, err = time_system(lambda: dg, mname, g, comm, args, device, input_cache=False)
                    row["systems"][f"mgg-{v}-nocache"] = ms
                    if err:
                        row["errors"][f"mgg-{v}-nocache"] = err
            dg.set_variant("pipelined")
            heap = sum(a.rows_per_pe * a.dim_padded * 4 for a in dg._arrays.values() if hasattr(a, "dim_padded"))
            row["memory_mb"] = {  # mgg's runs only (the baselines below come after this reading)
                "torch_peak_max_rank": comm.allreduce_scalar(torch.cuda.max_memory_allocated(device) / 2**20, "max"),
                "symmetric_heap_max_rank": comm.allreduce_scalar(heap / 2**20, "max")}
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
            if P == 1 and not m["mgg_only"]:  # "+unfused", "+cublas" change mgg's model only: baselines once
                def mk1():
                    s = SingleGpuGraph(g, device, kinds=(m["kind"],))
                    s.num_nodes = g.num_nodes
                    return s
                ms, err = time_system(mk1, mname, g, comm, args, device)
                row["systems"]["torch-sparse-1gpu"] = ms
                if err:
                    row["errors"]["torch-sparse-1gpu"] = err
                ms, err = plain_torch_epoch(g, mname, args, device, comm)
                row["systems"]["torch-plain-1gpu"] = ms
                if err:
                    row["errors"]["torch-plain-1gpu"] = err
                ms, err = pyg_epoch(g, mname, args, device, comm) if args.pyg else (None, "skipped")
                row["systems"]["pyg-1gpu"] = ms
                if err:
                    row["errors"]["pyg-1gpu"] = err
            if not m["mgg_only"]:
                row["aggregation"] = agg_floor(dg, m["kind"], m["hidden"], bw, comm, wanted=args.variants)
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
                sp = [f"x{s[k] / t:.2f} vs {k}" for k in ("nccl-halo+spmm", "mgg-nonpipelined", "torch-plain-1gpu",
                                                           "torch-sparse-1gpu", "pyg-1gpu") if s.get(k)]
                if d["P"] > 1 and label == "best" and base_best:
                    sp.append(f"x{base_best / t:.2f} vs best P=1")
                if sp:
                    cells.append(f"[{label}: " + ", ".join(sp) + "]")
            print(f"P={d['P']} {r['dataset']:>14} {r['model']}: best mgg {fmt(best)} | " + "  ".join(cells))
            for e, msg in r.get("errors", {}).items():
                print(f"      {e}: {msg}")
            for a in r.get("aggregation", []):
                if "hbm_floor_ms" not in a:  # results written before the two-floor accounting
                    print(f"      agg {a['variant']:>15}: {a['agg_ms']:.3f} ms, old single floor {a['floor_ms']:.3f} ms")
                    continue
                print(f"      agg {a['variant']:>15}: {a['agg_ms']:.3f} ms | HBM floor {a['hbm_floor_ms']:.3f} ms "
                      f"({a['hbm_floor_ms'] / a['agg_ms'] * 100:.0f}%) | gather floor {a['l2_floor_ms']:.3f} ms "
                      f"({a['l2_floor_ms'] / a['agg_ms'] * 100:.0f}% at {a['gather_GBps']:.0f} GB/s)"
                      + floor_note(a['l2_floor_ms'], a['agg_ms']))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1,papers-like:0.02")
    ap.add_argument("--models", default="gcn,gin")
    ap.add_argument("--variants", default=None, type=variant_list,
                    help="comma list of kernel variants to time (default: every benched variant of "
                    "mgg/kernels/variants.py); e.g. csr_rows,halo at P = 1 on large graphs")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ps", type=int, default=16)
    ap.add_argument("--dist", type=int, default=4)
    ap.add_argument("--wpb", type=int, default=4)
    ap.add_argument("--cuda-graph", action="store_true",
                    help="also time each mgg variant's step captured in a CUDA graph (mgg-V+cudagraph; at P > 1 with the NVSHMEM barriers inside)")
    ap.add_argument("--input-cache", choices=("on", "off", "both"), default="on",
                    help="mgg's models (and the baselines running mgg's model) start the first layer from "
                    "its input's aggregation computed once (on, the model default), aggregate every step "
                    "(off), or both: each mgg variant also timed without it (mgg-V-nocache)")
    ap.add_argument("--tf32", action="store_true",
                    help="float32 matmuls on TF32 tensor cores for every system of the run (torch's "
                    "'high' precision, as mgg.train --tf32); default IEEE float32")
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
    if args.tf32:
        import torch

        torch.set_float32_matmul_precision("high")
        print("float32 matmuls on TF32 tensor cores (--tf32), for every system", flush=True)
    run(args)


if __name__ == "__main__":
    main()
