"""End to end as a user runs it: `python -m mgg.train` in a fresh process on a `.npz` on disk.

For one graph file this runs, side by side in one invocation:
  * mgg with default flags (on a GPU the step is replayed from a CUDA graph: `--cuda-graph` is
    on by default there), with `--no-cuda-graph` (`mgg-eager`), with `--dropout 0`, and asked for
    by name: `--dropout 0 --no-cuda-graph` (`mgg-eager-nodrop`), `--cuda-graph` (`mgg-graph`,
    GPU only), `--dropout 0 --cuda-graph` (`mgg-graph-nodrop`, GPU only) and with 16-bit rows in
    the store, `--storage-dtype bf16` (`mgg-bf16`, `mgg-nodrop-bf16`; fp16: `mgg-fp16`), and with TF32 matmuls,
    `--tf32` (`mgg-tf32`, `mgg-nodrop-tf32`) (P = 1, or `--np P` under mpirun);
  * the same model (`--model`: gcn, gin or sage, with mgg's default hyperparameters) in plain
    torch, CSR SpMM with the Linear on the narrow side of the aggregation (bench/plain_model.py);
  * and in PyG, GCNConv, PyG's GIN model or SAGEConv, on ``edge_index`` (`pyg`) and on the sparse
    ``adj_t`` PyG's documentation recommends for full-batch training (`pyg-sparse`) (skipped
    when PyG is not installed; out-of-memory is reported as a result).
and prints the time from process start to the end of the first epoch, the validation accuracy
after the last epoch, the startup phases mgg reports (`phases` in its metrics JSON), the median epoch and the peak host RSS / GPU memory.
Every run is a fresh process, so the kernel cache state is whatever the machine has: run twice
(or pass `--cold-cache DIR` to force a cold first run) to see a cold and a warm start.

    python bench/e2e.py --graph reddit-like --scale 1 --epochs 20          # writes the .npz once
    python bench/e2e.py --file my.npz --runs mgg,mgg-nodrop,torch --np 2
    python bench/e2e.py --graph products-like --model gin --runs mgg,torch,pyg

Results: a JSON per run under `--out` (default bench/results/e2e-<graph>-<time>/) and the table.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: mgg's runs: their flags beside the defaults
MGG_RUNS = {"mgg": [], "mgg-eager": ["--no-cuda-graph"], "mgg-nodrop": ["--dropout", "0"],
            "mgg-eager-nodrop": ["--dropout", "0", "--no-cuda-graph"], "mgg-graph": ["--cuda-graph"],
            "mgg-graph-nodrop": ["--dropout", "0", "--cuda-graph"], "mgg-bf16": ["--storage-dtype", "bf16"],
            "mgg-nodrop-bf16": ["--dropout", "0", "--storage-dtype", "bf16"], "mgg-fp16": ["--storage-dtype", "fp16"],
            "mgg-tf32": ["--tf32"], "mgg-nodrop-tf32": ["--dropout", "0", "--tf32"]}
RUNS = (*MGG_RUNS, "torch", "pyg", "pyg-sparse")
DEFAULT_RUNS = ("mgg", "mgg-eager", "mgg-nodrop", "torch", "pyg", "pyg-sparse")  # mgg-graph*: GPU only, by name


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMPI_MCA_osc", "^ucx")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def timed(cmd: list[str], log_path: str, env: dict | None = None, timeout: float = 3600) -> dict:
    """Run `cmd` to completion; wall seconds, exit code and the child's peak RSS (MiB, from wait4:
    the child and the descendants it waited for)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env or _env(), cwd=ROOT)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": time.perf_counter() - t0, "rc": proc.returncode, "peak_rss_mb": usage.ru_maxrss / 1024,
            "command": shlex.join(cmd), "log": log_path}


def ensure_file(args) -> tuple[str, float | None]:
    """The graph file to use: `--file`, or `<out>/<graph>-<scale>.npz` generated (and saved
    atomically) once in a separate process. Returns (path, seconds spent generating or None)."""
    if args.file:
        return args.file, None
    order = "" if args.prepare_order == "none" else f"-{args.prepare_order}"
    path = os.path.join(args.data_dir, f"{args.graph}-{args.scale:g}{order}.npz")
    if os.path.exists(path):
        return path, None
    os.makedirs(args.data_dir, exist_ok=True)
    # the user's way: `python -m mgg.prepare` streams a preset into the file (little host memory)
    cmd = [sys.executable, "-m", "mgg.prepare", args.graph, "--scale", str(args.scale), "--out", path]
    if args.prepare_device:
        cmd += ["--device", args.prepare_device]
    if args.prepare_order != "none":  # relabelled once, in the file (the graph is held whole)
        cmd += ["--reorder-nodes", args.prepare_order]
    r = timed(cmd, path + ".log")
    if r["rc"] != 0:
        sys.exit(f"e2e: generating {args.graph}@{args.scale} failed; see {path}.log")
    return path, r["wall_s"]


def run_mgg(args, path: str, name: str, extra: list[str]) -> dict:
    metrics = os.path.join(args.out, f"{name}.json")
    launch = [sys.executable]
    if args.np > 1:
        launch = ["mpirun", "--bind-to", "none", "-np", str(args.np), "-x", "PYTHONPATH", "-x", "OMPI_MCA_osc",
                  "-x", "NVSHMEM_DISABLE_NVLS", "-x", "NCCL_NVLS_ENABLE", "-x", "PYTHONUNBUFFERED"]
        for var in ("MGG_KERNEL_CACHE", "OMP_NUM_THREADS", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
            if var in os.environ:  # the ranks share the caller's kernel cache and settings
                launch += ["-x", var]
        if os.geteuid() == 0:
            launch.insert(1, "--allow-run-as-root")
        launch.append(sys.executable)
    hidden = [] if args.hidden is None else ["--hidden", str(args.hidden)]
    cmd = launch + ["-m", "mgg.train", "--dataset", path, "--model", args.model, *hidden, "--epochs", str(args.epochs),
                    "--metrics-json", metrics, *shlex.split(args.mgg_flags), *extra]
    r = timed(cmd, os.path.join(args.out, f"{name}.log"))
    if r["rc"] == 0 and os.path.exists(metrics):
        with open(metrics) as f:
            m = json.load(f)
        r.update(median_epoch_ms=m.get("median_epoch_ms"), phases=m.get("phases"),
                 first_epoch_end_s=m.get("time_to_first_epoch_s"), memory=m.get("memory"),
                 val_acc=m.get("val_acc"), final_loss=m.get("final_loss"), cuda_graph=m.get("cuda_graph"))
        mem = m.get("memory") or {}
        r["peak_gpu_mb"] = max((x.get("gpu_peak_mb", 0) or 0 for x in mem.get("ranks", [])), default=None)
    r["status"] = "ok" if r["rc"] == 0 else f"exit {r['rc']}"
    return r


def run_plain(args, path: str, impl: str) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "bench", "plain_model.py"), "--file", path, "--impl", impl,
           "--model", args.model, "--epochs", str(args.epochs)]
    if args.hidden is not None:
        cmd += ["--hidden", str(args.hidden)]
    r = timed(cmd, os.path.join(args.out, f"{impl}.log"))
    try:
        with open(r["log"]) as f:
            last = [ln for ln in f.read().splitlines() if ln.startswith("{")][-1]
        r.update(json.loads(last))
    except (IndexError, ValueError, OSError):
        r["status"] = f"exit {r['rc']}"
    return r


def _fmt(v, spec=".1f", none="-") -> str:
    return none if v is None else format(v, spec)


def table(rows: dict) -> str:
    lines = [f"{'run':<16} {'status':<8} {'wall s':>8} {'1st epoch s':>11} {'epoch ms':>9} {'val acc':>7} "
             f"{'RSS MiB':>8} {'GPU MiB':>8}  phases (s)"]
    for name, r in rows.items():
        ph = r.get("phases") or {}
        phs = " ".join(f"{k}={v:.2f}" for k, v in ph.items()) if ph else (
            f"load={r['load_s']:.2f} build={r['build_s']:.2f}" if "load_s" in r else "")
        lines.append(f"{name:<16} {r.get('status', '?'):<8} {_fmt(r.get('wall_s')):>8} "
                     f"{_fmt(r.get('first_epoch_end_s')):>11} {_fmt(r.get('median_epoch_ms'), '.2f'):>9} "
                     f"{_fmt(r.get('val_acc'), '.4f'):>7} "
                     f"{_fmt(r.get('peak_rss_mb'), '.0f'):>8} {_fmt(r.get('peak_gpu_mb'), '.0f'):>8}  {phs}")
    for ref, label in (("torch", "plain torch"), ("pyg", "PyG (edge_index)"), ("pyg-sparse", "PyG (sparse adj_t)")):
        base = rows.get(ref, {}).get("median_epoch_ms")
        for name in MGG_RUNS:
            ours = rows.get(name, {}).get("median_epoch_ms")
            if ours and base:
                lines.append(f"{name}: {base / ours:.2f}x the {label} epoch")
    if rows.get("mgg", {}).get("median_epoch_ms") and rows.get("mgg-eager", {}).get("median_epoch_ms"):
        lines.append(f"--no-cuda-graph / default flags: "
                     f"{rows['mgg-eager']['median_epoch_ms'] / rows['mgg']['median_epoch_ms']:.2f}x")
    if rows.get("mgg", {}).get("median_epoch_ms") and rows.get("mgg-nodrop", {}).get("median_epoch_ms"):
        lines.append(f"default flags / --dropout 0: "
                     f"{rows['mgg']['median_epoch_ms'] / rows['mgg-nodrop']['median_epoch_ms']:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="mgg end to end (CLI as a user runs it) vs plain torch and PyG",
                                epilog=__doc__.split("\n\n")[2])
    p.add_argument("--graph", default="reddit-like", help="generated preset when --file is not given")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--file", help="an existing graph .npz (indptr, indices, x, y)")
    p.add_argument("--prepare-device", default=None,
                   help="where `python -m mgg.prepare` draws a generated graph (cpu, cuda; default cpu)")
    p.add_argument("--prepare-order", default="none", choices=("none", "degree", "rcm", "cluster"),
                   help="node order of the generated file (`mgg.prepare --reorder-nodes`); every run reads it")
    p.add_argument("--data-dir", default=os.environ.get("MGG_BENCH_DATA", "/tmp/mgg-bench-data"))
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--model", default="gcn", choices=("gcn", "gin", "sage"),
                   help="the model every run trains (mgg's registered defaults: GIN 5 x 64 with batch norm)")
    p.add_argument("--hidden", type=int, default=None, help="hidden width of every run (the model's default)")
    p.add_argument("--np", type=int, default=1, help="ranks for the mgg runs (mpirun when > 1)")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS),
                   help=f"comma list of {', '.join(RUNS)} (default {','.join(DEFAULT_RUNS)})")
    p.add_argument("--mgg-flags", default="", help="extra flags for every mgg run (quoted)")
    p.add_argument("--out", help="result folder (default bench/results/e2e-<graph>-<time>)")
    args = p.parse_args(argv)
    if "--model" in shlex.split(args.mgg_flags) or "--hidden" in shlex.split(args.mgg_flags):
        p.error("--mgg-flags: give --model and --hidden to bench/e2e.py itself (every run takes them)")
    runs = [r for r in args.runs.split(",") if r]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        p.error(f"--runs: unknown {bad}; choose from {', '.join(RUNS)}")
    args.out = args.out or os.path.join(ROOT, "bench", "results",
                                        f"e2e-{args.graph}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(args.out, exist_ok=True)
    path, gen_s = ensure_file(args)
    rows: dict[str, dict] = {}
    for name in runs:
        if name in MGG_RUNS:
            rows[name] = run_mgg(args, path, name, MGG_RUNS[name])
        else:
            rows[name] = run_plain(args, path, name)
        print(f"{name}: {rows[name].get('status')} ({rows[name]['wall_s']:.1f} s)", flush=True)
    doc = {"file": path, "generate_s": gen_s, "model": args.model, "epochs": args.epochs, "np": args.np, "runs": rows,
           "argv": sys.argv}
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(doc, f, indent=2)
    print(f"graph file: {path}" + (f" (generated and saved in {gen_s:.1f} s)" if gen_s else ""))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
