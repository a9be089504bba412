"""Strong scaling as a user runs it: `python -m mgg.train` with default flags at P = 1, 2, ...,
on a graph file in its input order and in the order `mgg.prepare` writes.

    python bench/scaling.py --cli [--ranks 1,2] [--datasets products-like:1] [--orders none,auto]
                            [--models gcn,gin] [--epochs 30] [--device cuda] [--out DIR]

Per dataset and order, `python -m mgg.prepare NAME --scale S --device D --reorder-nodes ORDER
--out DIR/NAME-S-ORDER.npz` writes the file once (kept and reused when it exists), and the bench
prints every rank's distinct remote rows under mgg's ranges for each P (the rows a halo gather
moves). Then for every model and P of `--ranks` the machine has GPUs for, `mpirun -np P python -m
mgg.train --dataset FILE --model M --epochs E --metrics-json ...` (P = 1 without mpirun) -- no
other flag, so the run is what a user gets -- and the table: median epoch ms, speedup over the
same order's P = 1, time to the first epoch, the largest rank's remote rows, the largest rank's
peak GPU and host memory, and the validation accuracy and final loss (which P ranks should share
with one rank).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mpirun() -> list[str]:
    cmd = ["mpirun", "--bind-to", "none", "--mca", "osc", "^ucx", "-x", "PYTHONPATH"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMPI_MCA_osc", "^ucx")
    return env


def graph_file(out: str, dataset: str, order: str, device: str) -> tuple[str, float]:
    """(path of `dataset` ("name:scale") written in `order` under `out`, seconds spent writing it;
    0 when it was there already)."""
    name, _, scale = dataset.partition(":")
    path = os.path.join(out, f"{name}-{scale or '1'}-{order}.npz")
    if os.path.exists(path):
        return path, 0.0
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "mgg.prepare", name, "--scale", scale or "1", "--device", device,
           "--reorder-nodes", order, "--out", path]
    print(" ".join(cmd), flush=True)
    subprocess.check_call(cmd, cwd=ROOT, env=_env())
    return path, time.perf_counter() - t0


def remote_rows(path: str, ranks: list[int]) -> dict[int, list[int]]:
    """{P: distinct remote rows of every rank} under mgg's ranges of the file's order."""
    sys.path.insert(0, ROOT)
    from mgg.data.npz import load_npz
    from mgg.runtime.footprint import array_chunks, footprints_from_chunks

    g = load_npz(path, mmap=True)
    fps = footprints_from_chunks(g.indptr, array_chunks(g.indices, g.num_edges), ranks)
    return {p: [f.remote_rows for f in fps[p]] for p in ranks}


def train_once(path: str, model: str, p: int, epochs: int, out: str) -> dict | None:
    """The metrics JSON of one default-flag `mgg.train` run on P ranks (None when it failed)."""
    metrics = os.path.join(out, f"{os.path.basename(path)[:-4]}-{model}-P{p}.json")
    cmd = [sys.executable, "-m", "mgg.train", "--dataset", path, "--model", model, "--epochs", str(epochs),
           "--metrics-json", metrics, "--no-progress"]
    if p > 1:
        cmd = [*_mpirun(), "-np", str(p), *cmd]
    print(" ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env=_env())
    if rc != 0 or not os.path.exists(metrics):
        print(f"  exited {rc}", flush=True)
        return None
    with open(metrics) as f:
        return json.load(f)


def peak_memory_gb(doc: dict | None) -> dict:
    """{"gpu_peak_gb", "host_peak_gb"}: the largest rank's peaks from a metrics JSON's `memory`
    (None where the run failed or did not record them)."""
    mem = (doc or {}).get("memory") or {}
    gpu, host = mem.get("max_gpu_peak_mb"), mem.get("max_host_peak_mb")
    return {"gpu_peak_gb": None if gpu is None else gpu / 1024, "host_peak_gb": None if host is None else host / 1024}


def cli_rows(args) -> list[dict]:
    from bench.scaling import _gpus

    have = _gpus()
    ranks = [p for p in args.ranks if p <= have]
    for p in sorted(set(args.ranks) - set(ranks)):
        print(f"P={p}: skipped, this machine has {have} GPU(s)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for ds in args.datasets.split(","):
        for order in args.orders.split(","):
            path, prep_s = graph_file(args.out, ds, order, args.device)
            rr = remote_rows(path, sorted(set(args.ranks) | {4}))
            for p, r in sorted(rr.items()):
                print(f"{ds} {order} P={p}: remote rows per rank {r} (max {max(r):,})", flush=True)
            for model in args.models.split(","):
                base = None
                for p in ranks:
                    doc = train_once(path, model, p, args.epochs, args.out)
                    ms = doc["median_epoch_ms"] if doc else None
                    if p == 1:
                        base = ms
                    rows.append({"dataset": ds, "order": order, "model": model, "P": p, "epoch_ms": ms,
                                 "speedup_vs_P1": base / ms if base and ms else None,
                                 "first_epoch_s": doc.get("time_to_first_epoch_s") if doc else None,
                                 "remote_rows_max": max(rr[p]), "prepare_s": prep_s,
                                 "val_acc": doc.get("val_acc") if doc else None,
                                 "final_loss": doc.get("final_loss") if doc else None,
                                 **peak_memory_gb(doc)})
    return rows


def print_cli_table(rows: list[dict]) -> None:
    def f(v, spec):  # a missing value: a dash in the column's width
        return format("-", ">" + spec.split(".")[0]) if v is None else format(v, spec)

    print(f"\n{'dataset':>16} {'order':>6} {'model':>5} {'P':>2} | {'epoch ms':>9} {'vs P=1':>7} | "
          f"{'first epoch s':>13} | {'remote rows max':>15} | {'GPU GB':>6} {'host GB':>7} | {'val acc':>7} "
          f"{'final loss':>10}")
    for r in rows:
        print(f"{r['dataset']:>16} {r['order']:>6} {r['model']:>5} {r['P']:>2} | {f(r['epoch_ms'], '9.2f')} "
              f"{f(r['speedup_vs_P1'], '7.2f')} | {f(r['first_epoch_s'], '13.1f')} | {r['remote_rows_max']:>15,} | "
              f"{f(r.get('gpu_peak_gb'), '6.1f')} {f(r.get('host_peak_gb'), '7.1f')} | {f(r['val_acc'], '7.4f')} "
              f"{f(r.get('final_loss'), '10.6f')}")


def add_cli_args(ap) -> None:
    ap.add_argument("--cli", action="store_true", help="time python -m mgg.train with default flags (this module)")
    ap.add_argument("--orders", default="none,auto", help="--cli: mgg.prepare --reorder-nodes values to compare")
    ap.add_argument("--epochs", type=int, default=30, help="--cli: epochs of every training run")
    ap.add_argument("--device", default="cuda", help="--cli: where mgg.prepare draws the preset and relabels it")


def run_cli(args) -> int:
    rows = cli_rows(args)
    print_cli_table(rows)
    sys.path.insert(0, ROOT)
    from mgg.atomic import atomic_write_json

    out = os.path.join(args.out, "scaling-cli.json")
    atomic_write_json(out, {"command": " ".join(["bench/scaling.py", *sys.argv[1:]]), "rows": rows})
    print(f"wrote {out}")
    return 0
