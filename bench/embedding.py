"""Embedding lookup benchmark: mgg one-sided lookups vs an all-to-all sharded lookup vs one process.

    mpirun -np 2 python bench/embedding.py                      # lookup mode (CPU: MPI; GPU: NCCL)
    python bench/embedding.py --mode serve --np 2               # service load test on loopback

Lookup mode, every rank looks up its own batch of B bags x L ids (Zipf-distributed ids, scattered
over the id space) from one table of N rows x D, hash-sharded over the P ranks:

* ``mgg``: `ShardedEmbeddingBag` forward -- CPU: unique rows fetched by one-sided MPI RMA gets
  from their owners, pooled locally; GPU: one kernel launch that checks, routes, reads (NVLink
  loads through nvshmem_ptr) and pools, plus with ``--checks sync`` one status read. On the GPU the
  table also reports per call what the module counted: kernel launches (torch operations
  included), host synchronisations, and bytes its kernel read from other PEs (NVLink on one node).
* ``a2a``: the TorchRec-style row-wise exchange -- unique ids sent to their owners (all-to-all of
  counts, then ids), owners read their rows, rows sent back (all-to-all), pooled locally.
  CPU: mpi4py Alltoallv; GPU: torch.distributed NCCL all_to_all_single.
* ``single``: one process holding the whole table (torch.nn.functional.embedding_bag), same B.

Latency is the max over ranks of one batch (ranks start together after a barrier); the table
reports medians, lookups/s (P*B*L ids per batch for the sharded ones, B*L for single) and the
ratios a2a/mgg and single/mgg of the latencies. Results go to
bench/results/embedding-<label>-<date>.json with host, P, command and date.

Serve mode starts `mpirun -np P python -m mgg.serve` on a generated table, sends a fixed number of
requests with a fixed concurrency from client threads, and reports requests/s, ids/s and the
client-side p50/p99 latency.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mgg.embedding import ShardedEmbeddingBag  # noqa: E402
from mgg.embedding.device_input import CHECKS  # noqa: E402
from mgg.runtime import world  # noqa: E402


def zipf_ids(rng, n, size, s):
    u = rng.random(size)
    k = np.minimum((np.exp(u * np.log(n + 1)) - 1).astype(np.int64), n - 1) if s == 1.0 else \
        np.minimum(((u * ((n + 1) ** (1 - s) - 1) + 1) ** (1 / (1 - s)) - 1).astype(np.int64), n - 1)
    return (k * 2654435761) % n


def host_info():
    return {"host": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ---------------------------------------------------------------------------------------------
# the all-to-all sharded lookup (TorchRec-style row-wise sharding)
class AllToAllLookup:
    def __init__(self, emb: ShardedEmbeddingBag, backend: str):
        self.emb, self.backend = emb, backend
        self.P, self.rank = emb.world_size, emb.rank
        self.local = emb.array.local  # this rank's rows (the same layout as mgg's)

    def _a2a_cpu(self, send: np.ndarray, scount: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        from mpi4py import MPI

        mpi = self.emb.comm.comm
        rcount = np.empty(self.P, dtype=np.int64)
        mpi.Alltoall(scount, rcount)
        sd = np.concatenate([[0], np.cumsum(scount)[:-1]]) * width
        rd = np.concatenate([[0], np.cumsum(rcount)[:-1]]) * width
        recv = np.empty((int(rcount.sum()),) + send.shape[1:], dtype=send.dtype)
        mt = MPI._typedict[send.dtype.char]
        mpi.Alltoallv([send, scount * width, sd, mt], [recv, rcount * width, rd, mt])
        return recv, rcount

    def __call__(self, idx: torch.Tensor, off: torch.Tensor, mode: str) -> torch.Tensor:
        if self.backend != "cpu" and idx.is_cuda:
            return self._gpu(idx, off, mode)
        keys = idx.cpu().numpy()
        uniq, inv = np.unique(keys, return_inverse=True)
        _, owner, local = self.emb.layout.locate_keys(uniq)
        order = np.argsort(owner, kind="stable")
        scount = np.bincount(owner, minlength=self.P).astype(np.int64)
        if self.backend == "cpu":
            ids_in, rcount = self._a2a_cpu(np.ascontiguousarray(local[order]), scount, 1)
            rows = self.local[torch.from_numpy(ids_in)].numpy()
            back, _ = self._a2a_cpu(np.ascontiguousarray(rows), rcount, self.emb.dim)
            fetched = torch.from_numpy(back)
        else:
            import torch.distributed as dist

            dev = self.local.device
            sc = torch.from_numpy(scount).to(dev)
            rc = torch.empty_like(sc)
            dist.all_to_all_single(rc, sc)
            rcl, scl = rc.tolist(), scount.tolist()
            ids_in = torch.empty(sum(rcl), dtype=torch.int64, device=dev)
            dist.all_to_all_single(ids_in, torch.from_numpy(local[order]).to(dev), rcl, scl)
            rows = self.local.index_select(0, ids_in)
            fetched = torch.empty((len(uniq), self.emb.dim), dtype=rows.dtype, device=dev)
            dist.all_to_all_single(fetched, rows, scl, rcl)
        u = torch.empty_like(fetched)
        u[torch.from_numpy(order).to(fetched.device)] = fetched
        return F.embedding_bag(torch.from_numpy(inv.reshape(-1)).to(u.device), u, off.to(u.device), mode=mode)

    def _gpu(self, idx: torch.Tensor, off: torch.Tensor, mode: str) -> torch.Tensor:
        """The same exchange with ids on the GPU throughout (unique, owners and the sort by owner
        as torch ops; the one host synchronisation is the split sizes NCCL needs)."""
        import torch.distributed as dist

        uniq, inv = torch.unique(idx, return_inverse=True)
        owner, local = self.emb.layout.locate(0, uniq)  # one table: keys are its rows
        owner, order = torch.sort(owner, stable=True)
        sc = torch.bincount(owner, minlength=self.P)
        rc = torch.empty_like(sc)
        dist.all_to_all_single(rc, sc)
        counts = torch.stack([sc, rc]).tolist()
        scl, rcl = counts[0], counts[1]
        ids_in = torch.empty(sum(rcl), dtype=torch.int64, device=idx.device)
        dist.all_to_all_single(ids_in, local[order].contiguous(), rcl, scl)
        rows = self.local.index_select(0, ids_in)
        fetched = torch.empty((len(uniq), self.local.shape[1]), dtype=rows.dtype, device=idx.device)
        dist.all_to_all_single(fetched, rows, scl, rcl)
        u = torch.empty_like(fetched)
        u[order] = fetched
        return F.embedding_bag(inv.reshape(-1), u[:, : self.emb.dim], off, mode=mode)


def bench_lookup(args) -> dict:
    comm = world()
    P, rank = comm.size, comm.rank
    backend = args.backend
    if backend == "auto":
        backend = "gpu" if torch.cuda.is_available() else "cpu"
    if backend == "gpu":
        import torch.distributed as dist

        torch.cuda.set_device(comm.local_rank)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(comm.bcast(29500 + os.getpid() % 1000)))
        dist.init_process_group("nccl", rank=rank, world_size=P)
    N, D, L = args.rows, args.dim, args.pooling
    emb = ShardedEmbeddingBag(N, D, args.mode_pool, "hash", comm=comm, seed=0, backend=backend, checks=args.checks)
    emb.eval()
    a2a = AllToAllLookup(emb, backend)
    single = None
    if rank == 0 and not args.no_single:
        from mgg.embedding import init_table

        single = init_table(N, D, seed=0).to(emb.array.local.device)
    dev = emb.array.local.device
    sync = (lambda: torch.cuda.synchronize()) if backend == "gpu" else (lambda: None)
    bw = {}
    if backend == "gpu":
        from bench.harness.timing import bandwidths

        bw = bandwidths(comm)
        if rank == 0:
            print(f"HBM copy {bw['hbm_GBps']:.0f} GB/s, GPU->GPU copy {bw.get('nvlink_GBps', float('nan')):.0f} GB/s",
                  flush=True)
    rows = []
    for B in args.batch_sizes:
        rng = np.random.default_rng(1000 * B + rank)
        batches = [(torch.from_numpy(zipf_ids(rng, N, B * L, args.zipf)), torch.arange(B) * L)
                   for _ in range(args.iters + args.warmup)]
        ref_ids = batches[0][0].numpy()
        if backend == "gpu":  # every system starts from ids already on its GPU, as a model's would be
            batches = [(i.to(dev), o.to(dev)) for i, o in batches]
        res = {}
        with torch.no_grad():
            ref = emb(*batches[0])
            emb.raise_input_errors()
            chk = a2a(*batches[0], args.mode_pool)
            assert torch.allclose(ref, chk.to(ref.device)), "a2a and mgg disagree"
            for name, fn in (("mgg", lambda b: emb(*b)), ("a2a", lambda b: a2a(*b, args.mode_pool))):
                if name == "mgg":
                    _, _, remote0 = emb.rows_read()
                    emb.counters.reset()
                ts = []
                for it, b in enumerate(batches):
                    comm.barrier()
                    t0 = time.perf_counter()
                    fn(b)
                    sync()
                    dt = time.perf_counter() - t0
                    dt = comm.allreduce_scalar(dt, "max")
                    if it >= args.warmup:
                        ts.append(dt)
                res[name] = float(np.median(ts))
                if name == "mgg":
                    per_call = emb.counters.per_call()
                    calls = emb.counters.calls
                    _, _, remote1 = emb.rows_read()
                    if backend == "gpu":
                        per_call["nvlink_bytes"] = (remote1 - remote0) / calls
                    else:  # the CPU store's calls are not counted
                        per_call = {}
            if single is not None:
                ts = []
                for it, (i, o) in enumerate(batches):
                    i, o = i.to(dev), o.to(dev)
                    t0 = time.perf_counter()
                    F.embedding_bag(i, single, o, mode=args.mode_pool)
                    sync()
                    if it >= args.warmup:
                        ts.append(time.perf_counter() - t0)
                res["single"] = float(np.median(ts))
        res = comm.bcast(res)
        per_call = comm.bcast(per_call)
        uniq_ids = np.unique(ref_ids)
        uniq = comm.allreduce_scalar(float(len(uniq_ids)) / (B * L)) / P
        floor = lookup_floor(emb, uniq_ids, B, bw, comm)
        rows.append({"batch": B, "ids_per_rank": B * L, "unique_fraction": uniq,
                     "median_s": res, "lookups_per_s": {k: (P if k != "single" else 1) * B * L / v for k, v in res.items()},
                     "ratio_a2a_over_mgg": res["a2a"] / res["mgg"],
                     "ratio_single_over_mgg": res.get("single", float("nan")) / res["mgg"],
                     "floor_s": floor, "mgg_over_floor": res["mgg"] / floor if floor > 0 else float("nan"),
                     "mgg_per_call": per_call})
        if rank == 0:
            print(f"B={B:6d}  mgg {res['mgg'] * 1e3:8.2f} ms  a2a {res['a2a'] * 1e3:8.2f} ms  "
                  f"single {res.get('single', float('nan')) * 1e3:8.2f} ms", flush=True)
    emb.free()
    if backend == "gpu":  # the all-to-all baseline's process group, ended before the interpreter exits
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"mode": "lookup", "backend": backend, "P": P, "rows": N, "dim": D, "pooling": L, "pool": args.mode_pool,
            "zipf": args.zipf, "iters": args.iters, "checks": args.checks, "results": rows}


def lookup_floor(emb, uniq_ids: np.ndarray, bags: int, bw: dict, comm) -> float:
    """Seconds one lookup cannot beat on the GPU (max over ranks): each distinct remote row once
    over NVLink (rows x D x 4 B / the measured GPU->GPU copy rate) plus each distinct local row
    read and each pooled bag written once from/to HBM (/ the measured device copy rate). NaN on
    the CPU backend (no measured rates)."""
    if not bw:
        return float("nan")
    _, owner, _ = emb.layout.locate_keys(uniq_ids)
    row = emb.dim * 4
    remote = int((owner != emb.rank).sum())
    local_bytes = (len(uniq_ids) - remote) * row + bags * row
    nv = bw.get("nvlink_GBps", float("inf"))
    t = remote * row / (nv * 1e9) + local_bytes / (bw["hbm_GBps"] * 1e9)
    return comm.allreduce_scalar(t, "max")


def print_lookup_table(r: dict) -> None:
    print(f"\n{r['label']}: P={r['P']}, table {r['rows']:,} x {r['dim']} (hash-sharded), {r['pooling']} ids/bag, "
          f"Zipf {r['zipf']}, median of {r['iters']} batches, checks {r.get('checks', 'sync')}")
    print(f"{'B/rank':>7} {'uniq':>5} | {'mgg ms':>8} {'a2a ms':>8} {'single ms':>9} | {'mgg Mlk/s':>9} {'a2a Mlk/s':>9} "
          f"{'1p Mlk/s':>8} | {'a2a/mgg':>7} {'1p/mgg':>6} | {'floor ms':>8} {'mgg/floor':>9} | "
          f"{'launch':>6} {'syncs':>5} {'NVLink KB':>9}  (mgg per call, rank 0)")
    for x in r["results"]:
        m, l, c = x["median_s"], x["lookups_per_s"], x.get("mgg_per_call", {})
        print(f"{x['batch']:>7} {x['unique_fraction']:5.2f} | {m['mgg'] * 1e3:8.2f} {m['a2a'] * 1e3:8.2f} "
              f"{m.get('single', float('nan')) * 1e3:9.2f} | {l['mgg'] / 1e6:9.2f} {l['a2a'] / 1e6:9.2f} "
              f"{l.get('single', float('nan')) / 1e6:8.2f} | {x['ratio_a2a_over_mgg']:7.2f} {x['ratio_single_over_mgg']:6.2f}"
              f" | {x.get('floor_s', float('nan')) * 1e3:8.3f} {x.get('mgg_over_floor', float('nan')):9.1f}"
              f" | {c.get('launches', float('nan')):6.1f} {c.get('host_syncs', float('nan')):5.1f} "
              f"{c.get('nvlink_bytes', float('nan')) / 1e3:9.1f}")


# ---------------------------------------------------------------------------------------------
def _gpu_ready() -> bool:
    try:
        import torch

        import cupy  # noqa: F401
        import nvshmem.core  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def bench_serve(args) -> dict:
    from mgg.embedding.client import EmbeddingClient

    tmp = tempfile.mkdtemp(prefix="mgg-bench-serve-")
    try:
        table = np.random.default_rng(0).standard_normal((args.rows, args.dim)).astype(np.float32)
        np.save(os.path.join(tmp, "t.npy"), table)
        with open(os.path.join(tmp, "tables.json"), "w") as f:
            json.dump([{"name": "t", "path": "t.npy", "mode": args.mode_pool, "sharding": "hash"}], f)
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "osc", "^ucx", "-np", str(args.np)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        cmd += [sys.executable, "-m", "mgg.serve", "--tables", os.path.join(tmp, "tables.json"), "--port", "0",
                "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]
        backend = args.backend if args.backend != "auto" else ("gpu" if _gpu_ready() else "cpu")
        cmd += ["--backend", backend]
        pp = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + pp if pp else ""), OMPI_MCA_osc="^ucx",
                   OMP_NUM_THREADS="1")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
        url = None
        while url is None:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("service did not start")
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            url = m.group(1) if m else None
        c = EmbeddingClient(url)
        rng = np.random.default_rng(1)
        B, L = args.req_bags, args.pooling
        reqs = [(zipf_ids(rng, args.rows, B * L, args.zipf), np.arange(B) * L) for _ in range(args.requests)]
        for i, o in reqs[:20]:  # warm up
            c.lookup("t", i, o)
        lat = []

        def one(r):
            t0 = time.perf_counter()
            c.lookup("t", *r)
            return time.perf_counter() - t0

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(args.concurrency) as ex:
            lat = list(ex.map(one, reqs))
        wall = time.perf_counter() - t0
        m = c.metrics()
        c.shutdown()
        rc = proc.wait(60)
        lat_ms = np.asarray(lat) * 1e3
        return {"mode": "serve", "backend": backend, "P": args.np, "rows": args.rows, "dim": args.dim, "pooling": L, "bags_per_request": B,
                "requests": args.requests, "concurrency": args.concurrency, "wall_s": wall,
                "requests_per_s": args.requests / wall, "ids_per_s": args.requests * B * L / wall,
                "p50_ms": float(np.percentile(lat_ms, 50)), "p90_ms": float(np.percentile(lat_ms, 90)),
                "p99_ms": float(np.percentile(lat_ms, 99)), "server_mean_batch": m["mean_batch_size"],
                "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms, "service_exit": rc}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("lookup", "serve"), default="lookup")
    p.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--pooling", type=int, default=4, help="ids per bag")
    p.add_argument("--pool", dest="mode_pool", choices=("sum", "mean", "max"), default="sum")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 8192, 32768, 65536])
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-single", action="store_true")
    p.add_argument("--checks", choices=CHECKS, default=CHECKS[0],
                   help="lookup mode, GPU: when bad ids raise (mgg.embedding.device_input.CHECKS)")
    p.add_argument("--np", type=int, default=2, help="serve mode: ranks of the service")
    p.add_argument("--requests", type=int, default=2000, help="serve mode: requests in total")
    p.add_argument("--concurrency", type=int, default=16, help="serve mode: client threads")
    p.add_argument("--req-bags", type=int, default=32, help="serve mode: bags per request")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--label", default=None, help="result label (default: CPU or GPU)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    now = datetime.datetime.now(datetime.timezone.utc)
    if args.mode == "serve":
        r = bench_serve(args)
        r["label"] = args.label or r["backend"].upper()
        print(f"\n{r['label']} service load test: P={r['P']}, {r['requests']} requests x {r['bags_per_request']} bags x "
              f"{r['pooling']} ids, concurrency {r['concurrency']}: {r['requests_per_s']:.0f} req/s, "
              f"{r['ids_per_s'] / 1e6:.2f} M ids/s, p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, "
              f"p99 {r['p99_ms']:.2f} ms (server mean batch {r['server_mean_batch']:.1f} requests)")
        rank = 0
    else:
        r = bench_lookup(args)
        r["label"] = args.label or r["backend"].upper()
        rank = world().rank
        if rank == 0:
            print_lookup_table(r)
    if rank == 0 and not args.no_save:
        r.update(host_info())
        r["command"] = (f"mpirun -np {r['P']} " if args.mode == "lookup" else "") + " ".join([sys.executable] + sys.argv)
        r["date"] = now.isoformat(timespec="seconds")
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"embedding-{args.mode}-{r['label'].lower()}-{now:%Y%m%d-%H%M%S}.json")
        with open(path, "w") as f:
            json.dump(r, f, indent=1)
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
