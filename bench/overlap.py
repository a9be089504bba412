"""Remote work beside local work: how much of the halo gather hides behind the local aggregation.

    mpirun -np P python bench/overlap.py [--datasets reddit-like:1,products-like:1] [--dims 16,64]
                                         [--kind gcn] [--reps 20]

Per dataset and width, on each rank's forward plan (P >= 2: there must be remote work), the
median milliseconds (max over ranks) of
  * local:   the local partitions alone (`GPUExecutor(..., only="local")`),
  * remote:  the unique-row gather and the remote partitions alone (`only="remote"`),
  * halo:    both, one after the other on one stream (variant `halo`),
  * overlap: the gather on a second stream beside the local partitions (variant `halo_overlap`),
and overlap / max(local, remote): 1.0 is perfect overlap, local + remote over max is none at all
(issue 18's target: <= 1.1). Results go to bench/results/overlap-P<P>-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.fullgraph import cuda_ms, load_graph, log  # noqa: E402


def measure(dg, kind: str, dim: int, reps: int, comm) -> dict:
    """The four timings of one width (see the module docstring), max over ranks."""
    import torch

    x = torch.randn(dg.n_local, dim, device=dg.device)
    sym = dg.symmetric(dim)
    out = {}
    for name, variant, only in (("local", "halo_overlap", "local"), ("remote", "halo_overlap", "remote"),
                                ("halo", "halo", None), ("overlap", "halo_overlap", None)):
        dg.set_variant(variant)
        ex = dg.executor(kind)

        def step(ex=ex, only=only):
            ex(x, sym, only=only)
        for _ in range(3):
            step()
        out[name] = comm.allreduce_scalar(statistics.median(cuda_ms(step, reps, comm)), "max")
    out["overlap_over_max"] = out["overlap"] / max(out["local"], out["remote"], 1e-9)
    out["sum_over_max"] = (out["local"] + out["remote"]) / max(out["local"], out["remote"], 1e-9)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1")
    ap.add_argument("--dims", default="16,64")
    ap.add_argument("--kind", default="gcn")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cache", default=os.environ.get("MGG_BENCH_CACHE", "/tmp/mgg-bench"))
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/overlap-P<P>-<date>.json)")
    args = ap.parse_args()
    import torch

    from mgg.runtime import DistGraph, RuntimeConfig, world

    comm = world()
    torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    if comm.size < 2:
        log(comm, "overlap needs remote work: run it under mpirun -np 2 or more")
        sys.exit(2)
    rows = []
    for spec in args.datasets.split(","):
        name, _, sc = spec.partition(":")
        g = load_graph(name, float(sc or 1), args.cache, comm)
        with DistGraph.build(g, comm, RuntimeConfig(backend="gpu")) as dg:
            p = dg.plan(args.kind)
            for dim in (int(d) for d in args.dims.split(",")):
                r = {"dataset": name, "scale": float(sc or 1), "dim": dim, "kind": args.kind,
                     "halo_rows": int(comm.allreduce_scalar(float(p.halo_size), "max")), **measure(dg, args.kind, dim,
                                                                                                 args.reps, comm)}
                rows.append(r)
    if comm.rank == 0:
        print(f"\nP={comm.size} {torch.cuda.get_device_name()} kind={args.kind} (ms, median of {args.reps}, max over ranks)")
        print(f"{'dataset':>16} {'D':>4} {'local':>8} {'remote':>8} {'halo':>8} {'overlap':>8} {'ovl/max':>8} {'sum/max':>8}")
        for r in rows:
            print(f"{r['dataset']:>16} {r['dim']:>4} {r['local']:>8.3f} {r['remote']:>8.3f} {r['halo']:>8.3f} "
                  f"{r['overlap']:>8.3f} {r['overlap_over_max']:>8.2f} {r['sum_over_max']:>8.2f}")
        path = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                        f"overlap-P{comm.size}-{_dt.date.today().isoformat()}.json")
        from mgg.atomic import atomic_write_json

        atomic_write_json(path, {"command": " ".join(sys.argv), "P": comm.size,
                                 "gpu": torch.cuda.get_device_name(), "rows": rows})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
