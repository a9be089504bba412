"""Strong scaling: one graph, P = 1, 2, 4, 8 GPUs, mgg against the NCCL halo-exchange baseline.

    python bench/scaling.py [--ranks 1,2,4,8] [--datasets reddit-like:1,products-like:1,papers-like:0.1]
                            [--models gcn,gin] [--out DIR] [-- extra bench/fullgraph.py flags]
    python bench/scaling.py --summarize DIR_OR_FILES...
    python bench/scaling.py --cli [--ranks 1,2] [--datasets products-like:1] [--orders none,auto] [--models gcn,gin]

`--cli` times `python -m mgg.train` with default flags instead, on each dataset written by
`mgg.prepare` in every order of `--orders` (bench/scaling_cli.py), with the remote rows per rank.

Run mode launches `mpirun -np P python bench/fullgraph.py` for every P of `--ranks` that the
machine has GPUs for (the others are named and skipped). Each run times, side by side on the same
graph file, every mgg kernel variant and `nccl-halo+spmm` (all-to-all of the halo rows, then torch
sparse SpMM) at that P. It also records what an epoch moves over NVLink (the distinct remote rows
of every aggregation the epoch really runs, `fullgraph.epoch_traffic`) and mgg's peak GPU memory.
It then prints the scaling table. Summarize mode prints the table from saved `fullgraph-*.json` files.

The table, per dataset, model and P:
  best mgg epoch (ms, the fastest variant) and its speedup over mgg's own best at P = 1; the NCCL
  baseline's epoch and mgg's speedup over it; peak GPU memory per GPU (torch allocations + the
  symmetric heap); NVLink MB per epoch (max over ranks) and the NVLink floor: those bytes over the
  GPU-to-GPU copy rate measured in the same run. The floor is a lower bound on the epoch, so
  floor / epoch is the share of the epoch that NVLink bandwidth alone would explain.
Goals: speedup over P = 1 of >= 1.8x (P=2), 3.4x (P=4), 6x (P=8); >= 1.5x over NCCL.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = {2: 1.8, 4: 3.4, 8: 6.0}


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _mpirun() -> list[str]:
    cmd = ["mpirun", "--bind-to", "none", "--mca", "osc", "^ucx"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def run(args, extra: list[str]) -> list[str]:
    """Launch fullgraph.py for every P that fits; returns the result files written."""
    have = _gpus()
    os.makedirs(args.out, exist_ok=True)
    before = set(glob.glob(os.path.join(args.out, "fullgraph-*.json")))
    for p in args.ranks:
        if p > have:
            print(f"P={p}: skipped, this machine has {have} GPU(s)", flush=True)
            continue
        cmd = [sys.executable, os.path.join(ROOT, "bench", "fullgraph.py"), "--datasets", args.datasets,
               "--models", args.models, "--out", args.out, *extra]
        if p > 1:
            cmd = [*_mpirun(), "-np", str(p), *cmd]
        print(f"P={p}: {' '.join(cmd)}", flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        if rc != 0:
            print(f"P={p}: bench/fullgraph.py exited {rc}", flush=True)
    return sorted(set(glob.glob(os.path.join(args.out, "fullgraph-*.json"))) - before)


def _finite(v):
    """v, or None for a missing or NaN reading (one GPU has no GPU-to-GPU copy rate)."""
    return None if v is None or v != v else v


def scaling_rows(docs: list[dict]) -> list[dict]:
    """One row per (dataset, model, P) from fullgraph result documents (pure; tested on CPU)."""
    one: dict[tuple[str, str], float] = {}
    rows = []
    for d in sorted(docs, key=lambda d: d["P"]):
        for r in d["runs"]:
            s = r["systems"]
            mgg = {k: v for k, v in s.items() if k.startswith("mgg-") and v}
            best_k = min(mgg, key=mgg.get) if mgg else None
            best = mgg.get(best_k) if best_k else None
            key = (r["dataset"], r["model"])
            if d["P"] == 1 and best:
                one[key] = best
            nccl = s.get("nccl-halo+spmm")
            tr, mem = r.get("traffic", {}), r.get("memory_mb", {})
            rows.append({
                "dataset": r["dataset"], "model": r["model"], "P": d["P"], "best_variant": best_k, "best_ms": best,
                "speedup_vs_P1": (one[key] / best) if best and key in one else None,
                "target": TARGET.get(d["P"]), "nccl_ms": nccl,
                "speedup_vs_nccl": (nccl / best) if best and nccl else None,
                "gpu_mb": (mem.get("torch_peak_max_rank", 0.0) + mem.get("symmetric_heap_max_rank", 0.0)) if mem else None,
                "nvlink_mb": tr.get("nvlink_bytes_max_rank", 0.0) / 2**20 if tr else None,
                "nvlink_floor_ms": tr.get("nvlink_floor_ms") if tr else None,
                "nvlink_GBps": _finite(d.get("bandwidth", {}).get("nvlink_GBps")),
            })
    return rows


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'dataset':>14} {'model':>5} {'P':>2} | {'best mgg ms':>11} {'variant':>14} {'vs P=1':>7} {'target':>6} | "
          f"{'NCCL ms':>8} {'vs NCCL':>7} | {'GPU MiB':>8} | {'NVLink MB':>9} {'floor ms':>8} {'floor/epoch':>11}")
    for r in rows:
        share = (r["nvlink_floor_ms"] / r["best_ms"]) if r["best_ms"] and r["nvlink_floor_ms"] is not None else None
        print(f"{r['dataset']:>14} {r['model']:>5} {r['P']:>2} | {_f(r['best_ms'], '11.2f')} {r['best_variant'] or '-':>14} "
              f"{_f(r['speedup_vs_P1'], '7.2f')} {_f(r['target'], '6.1f')} | {_f(r['nccl_ms'], '8.2f')} "
              f"{_f(r['speedup_vs_nccl'], '7.2f')} | {_f(r['gpu_mb'], '8.0f')} | {_f(r['nvlink_mb'], '9.1f')} "
              f"{_f(r['nvlink_floor_ms'], '8.3f')} {_f(share, '11.2f')}")


def load_docs(paths: list[str]) -> list[dict]:
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "fullgraph-*.json"))) if os.path.isdir(p) else sorted(glob.glob(p))
    if not files:
        raise SystemExit(f"bench/scaling.py: no fullgraph-*.json among {paths}")
    return [json.load(open(f)) for f in files]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,2,4,8", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1,papers-like:0.1")
    ap.add_argument("--models", default="gcn,gin")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "scaling"))
    ap.add_argument("--summarize", nargs="+", default=None, metavar="DIR_OR_FILE")
    sys.path.insert(0, ROOT)
    from bench.scaling_cli import add_cli_args, run_cli

    add_cli_args(ap)
    args = ap.parse_args(argv)
    if args.cli:
        return run_cli(args)
    paths = args.summarize if args.summarize is not None else run(args, extra)
    rows = scaling_rows(load_docs(paths if args.summarize is not None else [args.out]))
    print_table(rows)
    out = os.path.join(args.summarize[0] if args.summarize and os.path.isdir(args.summarize[0]) else args.out,
                       "scaling.json")
    sys.path.insert(0, ROOT)
    from mgg.atomic import atomic_write_json

    atomic_write_json(out, {"command": " ".join(["bench/scaling.py", *sys.argv[1:]]), "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
