"""Load test of the lookup service: requests/s and p50/p99 latency at 1, 16 and 64 clients, with
and without one adversarial client, every reply checked against a direct numpy lookup; and rank
0's peak memory for one maximal JSON and one maximal npz lookup.

    python bench/serve_load.py --np 2                       # this tree's service
    python bench/serve_load.py --np 2 --other-tree DIR      # and DIR's service, configuration by configuration

Each well-behaved client is a thread with one kept-alive connection sending npz lookups of
`--req-bags` bags x `--pooling` ids (Zipf ids, a pool of 256 requests whose float64 answers are
computed beforehand) back to back for `--seconds`. The adversary is another process (as a real
one is another machine) on its own connection, cycling through: an npz lookup of `--adv-ids` ids
in `--adv-bags` bags (the largest the default limits allow at D = 64; its answer checked too),
and a 100 KB JSON body of zero offsets (50K empty bags: refused with 413 by a service with
--max-reply-bytes, a ~60 MB JSON reply otherwise). A wrong answer or a 5xx for a well-formed
request is counted and fails the run (exit 1). Prints one line per configuration (with p99 over
the same clients' p99 without the adversary) and writes `--out` (JSON).

Maximal requests (`--peak`, Linux): before the load, each service gets a JSON lookup of ~15 MiB
of 3-digit ids in 16,000 bags and an npz lookup of 2.03M int64 ids in 60,000 bags (both just under
the default --max-body-bytes of 16 MiB), twice each after a warm-up, and rank 0's peak resident
set (VmHWM, reset before each) is compared with the body.
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from mgg.testing.serve import peak_rss_bytes, reset_peak_rss  # noqa: E402


def zipf_ids(rng, n, k, a=1.05):
    return (rng.zipf(a, k) - 1) % n


def npz(**arrays) -> bytes:
    b = io.BytesIO()
    np.savez(b, **arrays)
    return b.getvalue()


def start_service(tree: str, tables: str, np_: int, flags: list[str]) -> tuple[subprocess.Popen, str, int]:
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "osc", "^ucx", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    cmd += [sys.executable, "-m", "mgg.serve", "--tables", tables, "--port", "0", *flags]
    env = dict(os.environ, PYTHONPATH=tree, OMPI_MCA_osc="^ucx", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tree)
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the service of {tree} did not start")
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            return proc, m.group(1), int(m.group(2))


class Conn:
    """One kept-alive connection; reconnects when the service closed it."""

    def __init__(self, host, port):
        self.host, self.port, self.c = host, port, None

    def post(self, path, body, timeout=300.0) -> tuple[int, bytes]:
        for attempt in (0, 1):
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                self.c.request("POST", path, body=body)
                r = self.c.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.c.close()
                    self.c = None
                return r.status, data
            except (ConnectionError, http.client.HTTPException, OSError):
                self.c.close()
                self.c = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def adversary(host, port, folder, ready, stop, out) -> None:
    """The adversary's process: the maximal npz lookup (answer checked) and the amplifying JSON
    body, in turn, until `stop`; puts its counts on `out`."""
    with open(os.path.join(folder, "big.npz"), "rb") as f:
        big_body = f.read()
    with open(os.path.join(folder, "amp.json"), "rb") as f:
        amp_body = f.read()
    big_ref = np.load(os.path.join(folder, "big_ref.npy"))
    conn, stats = Conn(host, port), {"requests": 0, "statuses": {}, "wrong": 0, "errors": []}
    ready.set()
    while not stop.is_set():
        for kind, body, path in (("big", big_body, "/v1/lookup/npy?table=t"), ("amp", amp_body, "/v1/lookup")):
            if stop.is_set():
                break
            try:
                st, data = conn.post(path, body)
            except Exception as e:  # noqa: BLE001
                st, data = repr(e)[:40], b""
            stats["requests"] += 1
            key = f"{kind} {st}"
            stats["statuses"][key] = stats["statuses"].get(key, 0) + 1
            if kind == "big" and st == 200 and not np.allclose(np.load(io.BytesIO(data)), big_ref, rtol=1e-3, atol=1e-3):
                stats["wrong"] += 1
            if kind == "big" and st != 200:
                stats["errors"].append(f"adversary's well-formed lookup: {st} {data[:160]!r}")
    out.put(stats)


def run_config(host, port, pool, clients: int, seconds: float, adv_folder: str | None) -> dict:
    stop = threading.Event()
    lat, wrong, errors = [], [0], []
    lock = threading.Lock()

    def client(i):
        conn, k, mine = Conn(host, port), i, []
        while not stop.is_set():
            body, ref = pool[k % len(pool)]
            k += clients
            t0 = time.perf_counter()
            try:
                st, data = conn.post("/v1/lookup/npy?table=t", body)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))
                continue
            dt = time.perf_counter() - t0
            if st != 200:
                with lock:
                    errors.append(f"{st} {data[:160]!r}")
                continue
            if not np.allclose(np.load(io.BytesIO(data)), ref, rtol=1e-4, atol=1e-4):
                with lock:
                    wrong[0] += 1
            mine.append(dt)
        with lock:
            lat.extend(mine)

    adv = None
    if adv_folder is not None:
        ctx = multiprocessing.get_context("spawn")
        ready, adv_stop, adv_out = ctx.Event(), ctx.Event(), ctx.Queue()
        adv = ctx.Process(target=adversary, args=(host, port, adv_folder, ready, adv_stop, adv_out), daemon=True)
        adv.start()
        if not ready.wait(120):
            raise RuntimeError("the adversary's process did not start")
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(600)
    wall = time.perf_counter() - t0
    adv_stats = None
    if adv is not None:
        adv_stop.set()
        adv_stats = adv_out.get(timeout=600)
        adv.join(60)
        wrong[0] += adv_stats.pop("wrong")
        errors += adv_stats.pop("errors")
    ms = np.asarray(lat) * 1e3
    return {"clients": clients, "adversary": adv is not None, "requests": int(ms.size),
            "requests_per_s": ms.size / wall, "p50_ms": float(np.percentile(ms, 50)) if ms.size else None,
            "p99_ms": float(np.percentile(ms, 99)) if ms.size else None, "wrong": wrong[0],
            "errors": len(errors), "error_kinds": sorted({str(e) for e in errors})[:5],
            "adversary_requests": adv_stats}


def maximal_peaks(host, port, rng, reps: int = 2) -> list[dict]:
    """Rank 0's peak resident set growth for a maximal JSON and a maximal npz lookup (see the
    module docstring)."""
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("GET", "/v1/health")
    pid = json.loads(c.getresponse().read())["pid"]
    c.close()

    def request(fmt):
        if fmt == "json":
            n, bags = 3_950_000, 16_000
            idx = rng.integers(100, 1000, n)
        else:
            n, bags = 2_030_000, 60_000
            idx = rng.integers(0, 100_000, n)
        off = np.sort(rng.integers(0, n, bags))
        off[0] = 0
        if fmt == "json":
            return "/v1/lookup", json.dumps({"table": "t", "indices": idx.tolist(), "offsets": off.tolist()},
                                            separators=(",", ":")).encode()
        return "/v1/lookup/npy?table=t", npz(indices=idx, offsets=off)

    out = []
    for fmt in ("json", "npz"):
        conn = Conn(host, port)
        path, body = request(fmt)
        conn.post(path, body, timeout=600)  # warm-up: worker threads, allocator arenas
        for _ in range(reps):
            path, body = request(fmt)
            time.sleep(1)
            reset_peak_rss(pid)
            rss0 = peak_rss_bytes(pid)
            t0 = time.perf_counter()
            st, _ = conn.post(path, body, timeout=600)
            secs = time.perf_counter() - t0
            grown = peak_rss_bytes(pid) - rss0
            out.append({"format": fmt, "body_bytes": len(body), "status": st, "seconds": secs,
                        "rank0_peak_growth_bytes": grown, "ratio": grown / len(body)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--pooling", type=int, default=4)
    p.add_argument("--req-bags", type=int, default=32)
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--seconds", type=float, default=10.0, help="per configuration")
    p.add_argument("--adv-ids", type=int, default=2_000_000)
    p.add_argument("--adv-bags", type=int, default=60_000)
    p.add_argument("--other-tree", default=None, help="another checkout whose service runs the same load")
    p.add_argument("--service-flags", default="", help="extra mgg.serve flags for every service (one string)")
    p.add_argument("--peak", action="store_true", help="first measure rank 0's peak memory for maximal requests")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    W = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    tmp = tempfile.mkdtemp(prefix="mgg-serve-load-")
    results, peaks = [], []
    try:
        np.save(os.path.join(tmp, "t.npy"), W)
        with open(os.path.join(tmp, "tables.json"), "w") as f:
            json.dump([{"name": "t", "path": "t.npy", "mode": "sum", "sharding": "hash"}], f)
        B, L = args.req_bags, args.pooling
        pool = []
        for _ in range(256):
            idx = zipf_ids(rng, args.rows, B * L)
            pool.append((npz(indices=idx, offsets=np.arange(B) * L),
                         W[idx].astype(np.float64).reshape(B, L, -1).sum(1)))
        big_idx = rng.integers(0, args.rows, args.adv_ids)
        big_off = np.sort(rng.integers(0, args.adv_ids, args.adv_bags))
        big_off[0] = 0
        ends = np.append(big_off[1:], args.adv_ids)
        big_ref = np.add.reduceat(W[big_idx], big_off, axis=0, dtype=np.float64)
        big_ref[ends == big_off] = 0.0  # reduceat gives the row itself for an empty bag
        with open(os.path.join(tmp, "amp.json"), "wb") as f:
            f.write(json.dumps({"table": "t", "indices": [], "offsets": [0] * 50_000}).encode())
        with open(os.path.join(tmp, "big.npz"), "wb") as f:
            f.write(npz(indices=big_idx, offsets=big_off))
        np.save(os.path.join(tmp, "big_ref.npy"), big_ref)
        trees = [("this", ROOT)] + ([("other", os.path.abspath(args.other_tree))] if args.other_tree else [])
        services = {}
        try:
            for label, tree in trees:  # all up at once: every configuration runs on each in turn,
                services[label] = start_service(tree, os.path.join(tmp, "tables.json"), args.np,
                                                args.service_flags.split())
                host, port = services[label][1:]
                for _ in range(50):  # warm up
                    Conn(host, port).post("/v1/lookup/npy?table=t", pool[0][0])
            if args.peak:
                for label, _ in trees:
                    for r in maximal_peaks(*services[label][1:], rng):
                        peaks.append({"tree": label, **r})
                        print(f"{label:5s} maximal {r['format']:4s} body {r['body_bytes'] / 2**20:5.1f} MiB  status "
                              f"{r['status']}  {r['seconds']:5.1f} s  rank 0 peak +{r['rank0_peak_growth_bytes'] / 2**20:6.1f} MiB"
                              f" = {r['ratio']:5.2f}x the body", flush=True)
            for clients in map(int, args.clients.split(",")):  # so load drifting on a shared box hits both alike
                for adv in (None, tmp):
                    for label, _ in trees:
                        _, host, port = services[label]
                        r = run_config(host, port, pool, clients, args.seconds, adv)
                        r["tree"] = label
                        base = next((b for b in results if b["tree"] == label and b["clients"] == clients
                                     and not b["adversary"]), None) if adv else None
                        r["p99_over_no_adversary"] = r["p99_ms"] / base["p99_ms"] if base and r["p99_ms"] else None
                        results.append(r)
                        print(f"{label:5s} clients={clients:3d} adversary={'yes' if adv else 'no ':3s} "
                              f"{r['requests_per_s']:8.1f} req/s  p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms"
                              + (f" ({r['p99_over_no_adversary']:.2f}x)" if adv else "")
                              + f"  wrong {r['wrong']}  errors {r['errors']} {r['error_kinds']}"
                              + (f"  adversary {r['adversary_requests']['statuses']}" if adv else ""), flush=True)
        finally:
            for proc, _, _ in services.values():
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = {"np": args.np, "rows": args.rows, "dim": args.dim, "pooling": L, "req_bags": B, "seconds": args.seconds,
            "adv_ids": args.adv_ids, "adv_bags": args.adv_bags, "service_flags": args.service_flags,
            "maximal_requests": peaks, "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)
    bad = [r for r in results if r["tree"] == "this" and (r["wrong"] or r["errors"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
