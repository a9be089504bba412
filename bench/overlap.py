"""Remote work beside local work: how much of the halo gather hides behind the local aggregation.

    mpirun -np P python bench/overlap.py [--datasets reddit-like:1,products-like:1] [--dims 16,64]
                                         [--kind gcn] [--reps 20] [--designs halo_overlap,halo_csr]

Per dataset, width and design, on each rank's forward plan (P >= 2: there must be remote work),
the median milliseconds (max over ranks) of
  * local:   the local part alone (`only="local"`),
  * remote:  the unique-row gather and the remote part alone (`only="remote"`),
  * serial:  both, one after the other on one stream,
  * overlap: the gather on a second, high-priority stream beside the local part,
and overlap / max(local, remote): 1.0 is perfect overlap, local + remote over max is none at all
(an overlap pays below about 1.1). Designs: `halo_overlap` (partition kernels with atomics; serial =
variant `halo`) and `halo_csr` (the degree-aware row kernels, mgg/kernels/halo_csr.py; serial =
its `overlap = False`). Results go to bench/results/overlap-P<P>-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness.timing import cuda_ms, log  # noqa: E402
from bench.harness.workloads import load_graph, parse_dataset  # noqa: E402


#: per design: (variant of the halves and of the overlapped run, variant and overlap flag of the serial run)
DESIGNS = {"halo_overlap": ("halo_overlap", ("halo", True)), "halo_csr": ("halo_csr", ("halo_csr", False))}


def measure(dg, kind: str, dim: int, reps: int, comm, design: str) -> dict:
    """The four timings of one width and design (see the module docstring), max over ranks."""
    import torch

    x = torch.randn(dg.n_local, dim, device=dg.device)
    sym = dg.symmetric(dim)
    variant, (serial_variant, serial_overlap) = DESIGNS[design]
    out = {}
    for name, v, only, overlap in (("local", variant, "local", True), ("remote", variant, "remote", True),
                                   ("halo", serial_variant, None, serial_overlap),
                                   ("overlap", variant, None, True)):
        dg.set_variant(v)
        ex = dg.executor(kind)
        default = getattr(ex, "overlap", None)
        if default is not None:
            ex.overlap = overlap

        def step(ex=ex, only=only):
            ex(x, sym, only=only)
        for _ in range(3):
            step()
        out[name] = comm.allreduce_scalar(statistics.median(cuda_ms(step, reps, comm)), "max")
        if default is not None:
            ex.overlap = default
    out["overlap_over_max"] = out["overlap"] / max(out["local"], out["remote"], 1e-9)
    out["sum_over_max"] = (out["local"] + out["remote"]) / max(out["local"], out["remote"], 1e-9)
    return out


def parts(dg, kind: str, dim: int, reps: int, comm, thresholds=(None, 32, 64, 128)) -> list[dict]:
    """halo_csr's pieces timed one by one (max over ranks, ms): the host time of one whole call
    (launches only), the store round (write, publish, release), the halo gather, the local pass
    and the remote pass, per long-row threshold of the row schedule (None: the default)."""
    import torch

    from mgg.kernels.halo_csr import HaloCsrExecutor

    x = torch.randn(dg.n_local, dim, device=dg.device)
    sym = dg.symmetric(dim)
    ex = HaloCsrExecutor(dg.plan(kind), dg.store, kind)
    dv, dp, lanes, vpl = ex.local._layout(dim)
    halo = ex._halo(max(dg.plan(kind).halo_size, 1), dp)
    sym.write(x)
    sym.publish()
    out = ex.local.aggregate_local(x, sym)
    rows = []

    def med(fn):
        for _ in range(3):
            fn()
        return comm.allreduce_scalar(statistics.median(cuda_ms(fn, reps, comm)), "max")
    def host_ms(fn, k: int = 20) -> float:  # launch cost on the host (no synchronisation inside)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return comm.allreduce_scalar((t1 - t0) * 1e3 / k, "max")
    sym.release()
    base = {"host_call": host_ms(lambda: ex(x, sym))}
    sym.write(x)
    sym.publish()
    base.update({"store": med(lambda: (sym.release(), sym.write(x), sym.publish())),
                 "gather": med(lambda: ex._gather(sym, halo, dv, lanes, ex.prescale))})
    for thr in thresholds:
        ex.retune(long_threshold=thr)
        rows.append({**base, "threshold": thr, "local_pass": med(lambda: ex.local.aggregate_local(x, sym)),
                     "remote_pass": med(lambda: ex._remote_pass(halo, out, dv, lanes, vpl, ex.prescale, True))})
    sym.release()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1")
    ap.add_argument("--dims", default="16,64")
    ap.add_argument("--kind", default="gcn")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--designs", default="halo_overlap,halo_csr", help=f"of {','.join(DESIGNS)}")
    ap.add_argument("--parts", action="store_true", help="also time halo_csr's pieces (store round, gather, "
                    "local pass, remote pass) per long-row threshold")
    ap.add_argument("--cache", default=os.environ.get("MGG_BENCH_CACHE", "/tmp/mgg-bench"))
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/overlap-P<P>-<date>.json)")
    args = ap.parse_args()
    import torch

    from mgg.runtime import world
    from mgg.graph import DistGraph, RuntimeConfig

    comm = world()
    torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    if comm.size < 2:
        log(comm, "overlap needs remote work: run it under mpirun -np 2 or more")
        sys.exit(2)
    rows, prow = [], []
    for spec in args.datasets.split(","):
        name, scale, order = parse_dataset(spec)
        g = load_graph(name, scale, args.cache, comm, order)
        name = g.name
        with DistGraph.build(g, comm, RuntimeConfig(backend="gpu")) as dg:
            p = dg.plan(args.kind)
            for dim in (int(d) for d in args.dims.split(",")):
                for design in args.designs.split(","):
                    r = {"dataset": name, "scale": scale, "dim": dim, "kind": args.kind, "design": design,
                         "halo_rows": int(comm.allreduce_scalar(float(p.halo_size), "max")),
                         **measure(dg, args.kind, dim, args.reps, comm, design)}
                    rows.append(r)
                if args.parts:
                    for q in parts(dg, args.kind, dim, args.reps, comm):
                        prow.append({"dataset": name, "dim": dim, **q})
    if comm.rank == 0:
        print(f"\nP={comm.size} {torch.cuda.get_device_name()} kind={args.kind} (ms, median of {args.reps}, max over ranks)")
        print(f"{'dataset':>16} {'D':>4} {'design':>13} {'local':>8} {'remote':>8} {'serial':>8} {'overlap':>8} "
              f"{'ovl/max':>8} {'sum/max':>8}")
        for r in rows:
            print(f"{r['dataset']:>16} {r['dim']:>4} {r['design']:>13} {r['local']:>8.3f} {r['remote']:>8.3f} {r['halo']:>8.3f} "
                  f"{r['overlap']:>8.3f} {r['overlap_over_max']:>8.2f} {r['sum_over_max']:>8.2f}")
        if prow:
            print(f"\nhalo_csr pieces (ms): {'dataset':>14} {'D':>4} {'thr':>5} {'host':>7} {'store':>7} {'gather':>7} "
                  f"{'local':>7} {'remote':>7}")
            for q in prow:
                print(f"{'':21}{q['dataset']:>14} {q['dim']:>4} {str(q['threshold']):>5} {q['host_call']:>7.3f} "
                      f"{q['store']:>7.3f} {q['gather']:>7.3f} {q['local_pass']:>7.3f} {q['remote_pass']:>7.3f}")
        path = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                        f"overlap-P{comm.size}-{_dt.date.today().isoformat()}.json")
        from mgg.atomic import atomic_write_json

        atomic_write_json(path, {"command": " ".join(sys.argv), "P": comm.size,
                                 "gpu": torch.cuda.get_device_name(), "rows": rows, "parts": prow})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
