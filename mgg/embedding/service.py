"""The embedding-lookup service: HTTP on rank 0, dynamic batching, SPMD lookups over all ranks.

Threads and ranks:

* rank 0, HTTP threads (`ThreadingHTTPServer`): parse and validate a request (4xx on anything
  wrong), enqueue a job, wait for its result.
* rank 0, main thread (the batcher): takes up to `max_batch` jobs or waits `max_wait_ms` after the
  first, broadcasts the operation header to every rank, runs the batch as one
  `MultiTableEmbeddingBag.forward` (rank 0's share is the whole batch: one exchange for all
  requests and tables; the other ranks take part with an empty batch and serve their slices to
  rank 0's one-sided gets), then hands each job its rows.
* ranks > 0: wait for the header (non-blocking `Ibcast` polled with short sleeps so idle ranks do
  not spin a core), join the operation, repeat until STOP.

Control operations go through the same queue: SNAPSHOT (rank 0 reads every table through the
store and writes `<snapshot>/<table>.npy` + `tables.json`, each to a temp file then `os.replace`)
and STOP (from `POST /v1/shutdown` or SIGTERM/SIGINT on rank 0): every rank leaves the loop,
frees the store and returns 0.
"""
from __future__ import annotations

import hmac
import io
import ipaddress
import json
import os
import queue
import signal
import threading
import time
import traceback
import zipfile
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import torch

from ..runtime.comm import Communicator
from .bag import MultiTableEmbeddingBag
from .io import NAME_RE, open_table, write_json_atomic, write_npy_atomic
from .table import TableConfig
from .validate import check_bag_input

__all__ = ["ServiceConfig", "EmbeddingService", "is_loopback", "BadRequest"]

OP_LOOKUP, OP_SNAPSHOT, OP_STOP = 1, 2, 3


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8700
    token: str | None = None
    max_body_bytes: int = 16 << 20
    max_batch: int = 64
    max_wait_ms: float = 2.0
    request_timeout_s: float = 60.0
    snapshot_dir: str = "snapshots"


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Job:
    __slots__ = ("op", "table", "bag", "arg", "done", "result", "error")

    def __init__(self, op, table=None, bag=None, arg=None):
        self.op, self.table, self.bag, self.arg = op, table, bag, arg
        self.done = threading.Event()
        self.result = self.error = None


class _Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: Counter = Counter()
        self.errors: Counter = Counter()
        self.lat = deque(maxlen=20000)
        self.batches = 0
        self.batched_requests = 0
        self.started = time.time()

    def record(self, endpoint: str, status: int, seconds: float | None) -> None:
        with self.lock:
            self.requests[endpoint] += 1
            if status >= 400:
                self.errors[str(status)] += 1
            if seconds is not None and status == 200:
                self.lat.append(seconds)

    def snapshot(self) -> dict:
        with self.lock:
            lat = np.asarray(self.lat, dtype=np.float64) * 1e3
            pct = {f"p{q}": (float(np.percentile(lat, q)) if lat.size else None) for q in (50, 90, 99)}
            return {"uptime_s": time.time() - self.started, "requests": dict(self.requests),
                    "requests_total": int(sum(self.requests.values())), "errors": dict(self.errors),
                    "errors_total": int(sum(self.errors.values())),
                    "lookup_latency_ms": {**pct, "count": int(lat.size)},
                    "batches": self.batches, "batched_requests": self.batched_requests,
                    "mean_batch_size": self.batched_requests / self.batches if self.batches else None}


class EmbeddingService:
    """Collective: every rank constructs it (loading its rows of every table) and calls `run()`."""

    def __init__(self, specs: list[TableConfig], comm: Communicator, cfg: ServiceConfig, store=None):
        self.comm, self.cfg, self.specs = comm, cfg, specs
        self.names = {s.name: i for i, s in enumerate(specs)}
        err, arrays, shapes = None, [], []
        try:
            for s in specs:
                arrays.append(open_table(s))
                shapes.append(tuple(arrays[-1].shape))
        except Exception as e:  # noqa: BLE001 - agreed below
            err = e
        comm.check(err)
        if len(set(map(tuple, comm.allgather(shapes)))) != 1:
            raise ValueError("table files differ between ranks")
        tables = [s.with_shape(n, d) for s, (n, d) in zip(specs, shapes)]
        self.bag = MultiTableEmbeddingBag(tables, comm, store, include_last_offset=True, weights=arrays)
        self.bag.eval()
        del arrays
        self.metrics = _Metrics()
        self.queue: queue.Queue[_Job] = queue.Queue()
        self.stop_event = threading.Event()
        self.httpd: ThreadingHTTPServer | None = None

    # -- binding (rank 0), agreed with the other ranks ---------------------------------------------
    def bind(self) -> None:
        err = None
        if self.comm.rank == 0:
            try:
                self.httpd = _Server((self.cfg.host, self.cfg.port), _Handler)
                self.httpd.service = self
            except OSError as e:
                err = OSError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e.strerror or e}")
        self.comm.check(err)

    @property
    def address(self) -> tuple[str, int]:
        return self.httpd.server_address[:2]

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            if self.comm.rank == 0:
                self._run_root()
            else:
                self._run_worker()
        finally:
            self.bag.free()
        return 0

    def _bcast_header(self, op: int) -> None:
        if self.comm.size > 1:
            hdr = np.array([op, 0], dtype=np.int64)
            self.comm.comm.Ibcast(hdr, root=0).Wait()

    def _run_worker(self) -> None:
        mpi = self.comm.comm
        while True:
            hdr = np.zeros(2, dtype=np.int64)
            req = mpi.Ibcast(hdr, root=0)
            while not req.Test():
                time.sleep(0.0002)
            op = int(hdr[0])
            if op == OP_LOOKUP:
                self._lookup_collective([])
            elif op == OP_SNAPSHOT:
                self._snapshot_collective(self.comm.bcast(None))
            elif op == OP_STOP:
                return

    def _run_root(self) -> None:
        def on_signal(signum, frame):  # noqa: ARG001
            self.stop_event.set()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        http = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                                name="mgg-serve-http")
        http.start()
        try:
            while not self.stop_event.is_set():
                try:
                    first = self.queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if first.op != OP_LOOKUP:
                    self._control(first)
                    continue
                batch, held = [first], None
                deadline = time.monotonic() + self.cfg.max_wait_ms / 1e3
                while len(batch) < self.cfg.max_batch:
                    left = deadline - time.monotonic()
                    try:
                        j = self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait()
                    except queue.Empty:
                        break
                    if j.op != OP_LOOKUP:
                        held = j
                        break
                    batch.append(j)
                self._bcast_header(OP_LOOKUP)
                self._lookup_collective(batch)
                if held is not None:
                    self._control(held)
        finally:
            self._bcast_header(OP_STOP)
            self.httpd.shutdown()
            self.httpd.server_close()
            while True:  # whatever is still queued gets an answer
                try:
                    j = self.queue.get_nowait()
                except queue.Empty:
                    break
                j.error = BadRequest(503, "service is shutting down")
                j.done.set()
            for s, h in old.items():
                signal.signal(s, h)

    def _control(self, job: _Job) -> None:
        if job.op == OP_STOP:
            self.stop_event.set()
            job.result = {"status": "stopping"}
            job.done.set()
        elif job.op == OP_SNAPSHOT:
            self._bcast_header(OP_SNAPSHOT)
            self.comm.bcast(job.arg)
            try:
                job.result = self._snapshot_collective(job.arg)
            except Exception as e:  # noqa: BLE001 - reported to the client, the service goes on
                job.error = BadRequest(500, f"snapshot failed: {type(e).__name__}: {e}")
            job.done.set()

    def _lookup_collective(self, batch: list[_Job]) -> None:
        """All ranks: one forward over every table; rank 0 holds the batch, the others an empty one."""
        T = self.bag.num_tables
        idx, off, psw = [None] * T, [None] * T, [None] * T
        try:
            by_table: dict[int, list[_Job]] = {}
            for j in batch:
                by_table.setdefault(j.table, []).append(j)
            for t, jobs in by_table.items():
                pos, offs = 0, []
                for j in jobs:
                    offs.append(j.bag.offsets[:-1] + pos)
                    pos += int(j.bag.offsets[-1])
                idx[t] = torch.cat([j.bag.indices[: int(j.bag.offsets[-1])] for j in jobs])
                off[t] = torch.cat(offs + [torch.tensor([pos])])
                if any(j.bag.per_sample_weights is not None for j in jobs):
                    psw[t] = torch.cat([j.bag.per_sample_weights[: int(j.bag.offsets[-1])].float()
                                        if j.bag.per_sample_weights is not None
                                        else torch.ones(int(j.bag.offsets[-1])) for j in jobs])
            with torch.no_grad():
                outs = self.bag(idx, off, psw)
            for t, jobs in by_table.items():
                b = 0
                res = outs[t].cpu().numpy()
                for j in jobs:
                    j.result = res[b: b + j.bag.num_bags]
                    b += j.bag.num_bags
            if batch:
                with self.metrics.lock:
                    self.metrics.batches += 1
                    self.metrics.batched_requests += len(batch)
        except Exception as e:  # noqa: BLE001 - never lose the service over one batch
            for j in batch:
                j.error = BadRequest(500, f"lookup failed: {type(e).__name__}: {e}")
            traceback.print_exc()
        finally:
            for j in batch:
                j.done.set()
            self.comm.barrier()

    def _snapshot_collective(self, path: str) -> dict:
        """All ranks; rank 0 reads the tables through the store and writes them atomically."""
        err, result = None, None
        if self.comm.rank == 0:
            try:
                os.makedirs(path, exist_ok=True)
                entries = []
                for t, s in enumerate(self.specs):
                    cfg = self.bag.tables[t]

                    def fill(mm, t=t, n=cfg.num_embeddings):
                        for a in range(0, n, 1 << 16):
                            rows = np.arange(a, min(n, a + (1 << 16)), dtype=np.int64)
                            mm[a: a + len(rows)] = self.bag.read_rows(t, rows).numpy()

                    write_npy_atomic(os.path.join(path, f"{s.name}.npy"), (cfg.num_embeddings, cfg.embedding_dim),
                                     np.float32, fill)
                    entries.append({"name": s.name, "path": f"{s.name}.npy", "mode": s.mode, "sharding": s.sharding})
                write_json_atomic(os.path.join(path, "tables.json"), {"tables": entries})
                result = {"path": os.path.join(path, "tables.json"), "tables": [e["name"] for e in entries]}
            except Exception as e:  # noqa: BLE001
                err = e
        self.comm.barrier()
        if err is not None:
            raise err
        return result

    # -- request handling (rank 0, HTTP threads) ---------------------------------------------------
    def submit(self, job: _Job) -> Any:
        if self.stop_event.is_set():
            raise BadRequest(503, "service is shutting down")
        self.queue.put(job)
        if not job.done.wait(self.cfg.request_timeout_s):
            raise BadRequest(504, "lookup timed out")
        if job.error is not None:
            raise job.error
        return job.result

    def parse_lookup(self, table: Any, indices: Any, offsets: Any, psw: Any) -> _Job:
        if not isinstance(table, str):
            raise BadRequest(400, "\"table\" must be a string")
        if table not in self.names:
            raise BadRequest(404, f"unknown table {table!r}; tables: {sorted(self.names)}")
        t = self.names[table]
        cfg = self.bag.tables[t]
        if indices is None or offsets is None:
            raise BadRequest(400, "\"indices\" and \"offsets\" are required")
        try:
            bag = check_bag_input(_ints(indices, "indices"), _ints(offsets, "offsets"),
                                  None if psw is None else _floats(psw), num_embeddings=cfg.num_embeddings,
                                  mode=cfg.mode, include_last_offset=False, what=f"table {table!r}")
        except (ValueError, TypeError, IndexError) as e:
            raise BadRequest(422 if isinstance(e, IndexError) else 400, str(e)) from None
        return _Job(OP_LOOKUP, t, bag)

    def tables_info(self) -> dict:
        return {c.name: {"num_embeddings": c.num_embeddings, "embedding_dim": c.embedding_dim, "mode": c.mode,
                         "sharding": c.sharding} for c in self.bag.tables}


def _ints(x: Any, what: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        arr = x
    else:
        if not isinstance(x, list):
            raise BadRequest(400, f"\"{what}\" must be a list of integers")
        try:
            arr = np.asarray(x)
        except (ValueError, OverflowError):
            raise BadRequest(400, f"\"{what}\" must be a flat list of integers") from None
        if arr.size == 0:
            arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise BadRequest(400, f"\"{what}\" must be a 1-D list of integers (got {arr.dtype} with {arr.ndim} dims)")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise BadRequest(400, f"\"{what}\": value too large")
    return arr.astype(np.int64)


def _floats(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        arr = x
    else:
        if not isinstance(x, list):
            raise BadRequest(400, "\"per_sample_weights\" must be a list of numbers")
        try:
            arr = np.asarray(x)
        except (ValueError, OverflowError):
            raise BadRequest(400, "\"per_sample_weights\" must be a flat list of numbers") from None
    if arr.dtype.kind not in "iuf" or arr.ndim != 1:
        raise BadRequest(400, f"\"per_sample_weights\" must be a 1-D list of numbers (got {arr.dtype})")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise BadRequest(400, "\"per_sample_weights\" must be finite")
    return arr


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    service: EmbeddingService


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mgg-serve/0.1"
    server: _Server

    def log_message(self, fmt, *args):  # quiet: metrics count requests
        pass

    # -- plumbing ----------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _authorized(self) -> bool:
        token = self.server.service.cfg.token
        if not token:
            return True
        got = self.headers.get("Authorization", "")
        got = got[7:] if got.startswith("Bearer ") else self.headers.get("X-Auth-Token", "")
        return hmac.compare_digest(got.encode(), token.encode())

    def _body(self, bodiless_ok: bool = False) -> bytes:
        """The request body (Content-Length bytes). Without Content-Length (and not chunked) an
        HTTP/1.1 request has no body: `bodiless_ok` endpoints (snapshot, shutdown: `curl -X POST`)
        get b"", the others answer 411."""
        limit = self.server.service.cfg.max_body_bytes
        n = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise BadRequest(411, "chunked bodies are not accepted; send Content-Length")
        if n is None:
            if bodiless_ok:
                return b""
            self.close_connection = True
            raise BadRequest(411, "Content-Length is required")
        try:
            n = int(n)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise BadRequest(400, "bad Content-Length") from None
        if n > limit:
            self.close_connection = True  # the body is not read
            raise BadRequest(413, f"body of {n} bytes exceeds --max-body-bytes={limit}")
        body = self.rfile.read(n)
        if len(body) != n:
            self.close_connection = True
            raise BadRequest(400, "truncated body")
        return body

    def _handle(self, method: str) -> None:
        svc = self.server.service
        t0 = time.perf_counter()
        url = urlsplit(self.path)
        endpoint = f"{method} {url.path}"
        status, timed = 200, False
        try:
            routes = {("GET", "/v1/health"), ("GET", "/v1/metrics"), ("POST", "/v1/lookup"),
                      ("POST", "/v1/lookup/npy"), ("POST", "/v1/snapshot"), ("POST", "/v1/shutdown")}
            if (method, url.path) not in routes:
                paths = {p for _, p in routes}
                endpoint = f"{method} (unknown)"
                raise BadRequest(405 if url.path in paths else 404, f"no endpoint {method} {url.path}")
            if url.path != "/v1/health" and not self._authorized():
                raise BadRequest(401, "missing or wrong token (Authorization: Bearer TOKEN)")
            if url.path == "/v1/health":
                self._json(200, {"status": "ok", "world_size": svc.comm.size, "pid": os.getpid(),
                                 "tables": svc.tables_info()})
            elif url.path == "/v1/metrics":
                self._json(200, svc.metrics.snapshot())
            elif url.path == "/v1/lookup":
                timed = True
                doc = self._json_body()
                unknown = set(doc) - {"table", "indices", "offsets", "per_sample_weights"}
                if unknown:
                    raise BadRequest(400, f"unknown fields {sorted(unknown)}")
                job = svc.parse_lookup(doc.get("table"), doc.get("indices"), doc.get("offsets"),
                                       doc.get("per_sample_weights"))
                out = svc.submit(job)
                self._json(200, {"table": doc["table"], "shape": list(out.shape), "embeddings": out.tolist()})
            elif url.path == "/v1/lookup/npy":
                timed = True
                q = parse_qs(url.query)
                table = q.get("table", [None])[0]
                arrays = self._npz_body()
                unknown = set(arrays) - {"indices", "offsets", "per_sample_weights"}
                if unknown:
                    raise BadRequest(400, f"unknown arrays {sorted(unknown)} in the npz body")
                job = svc.parse_lookup(table, arrays.get("indices"), arrays.get("offsets"),
                                       arrays.get("per_sample_weights"))
                out = svc.submit(job)
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(out, dtype=np.float32), allow_pickle=False)
                self._send(200, buf.getvalue(), "application/x-npy")
            elif url.path == "/v1/snapshot":
                doc = self._json_body(allow_empty=True)
                name = doc.get("name") or time.strftime("snapshot-%Y%m%d-%H%M%S")
                if not isinstance(name, str) or not NAME_RE.match(name) or name in (".", ".."):
                    raise BadRequest(400, f"snapshot name must match {NAME_RE.pattern}")
                res = svc.submit(_Job(OP_SNAPSHOT, arg=os.path.join(os.path.abspath(svc.cfg.snapshot_dir), name)))
                self._json(200, res)
            elif url.path == "/v1/shutdown":
                self._body(bodiless_ok=True)
                if not svc.cfg.token and not is_loopback(self.client_address[0]):
                    raise BadRequest(403, "shutdown without a token is only allowed from loopback")
                self.close_connection = True
                self._json(200, {"status": "stopping"})
                self.wfile.flush()
                svc.stop_event.set()  # after the answer is out: the batcher then stops every rank
        except BadRequest as e:
            status = e.status
            self._json(e.status, {"error": str(e), "status": e.status})
        except Exception as e:  # noqa: BLE001 - a handler never takes the service down
            status = 500
            self._json(500, {"error": f"internal error: {type(e).__name__}: {e}", "status": 500})
        finally:
            svc.metrics.record(endpoint, status, time.perf_counter() - t0 if timed else None)

    def _json_body(self, allow_empty: bool = False) -> dict:
        body = self._body(bodiless_ok=allow_empty)
        if not body and allow_empty:
            return {}
        try:
            doc = json.loads(body, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(400, f"malformed JSON body: {e}") from None
        if not isinstance(doc, dict):
            raise BadRequest(400, "the JSON body must be an object")
        return doc

    def _npz_body(self) -> dict[str, np.ndarray]:
        body = self._body()
        limit = self.server.service.cfg.max_body_bytes
        try:
            with zipfile.ZipFile(io.BytesIO(body)) as z:
                if sum(i.file_size for i in z.infolist()) > limit:
                    raise BadRequest(413, f"npz body expands beyond --max-body-bytes={limit}")
                with np.load(io.BytesIO(body), allow_pickle=False) as npz:
                    return {k: npz[k] for k in npz.files}
        except BadRequest:
            raise
        except Exception as e:  # noqa: BLE001 - zipfile/np.load raise many kinds
            raise BadRequest(400, f"malformed npz body: {type(e).__name__}: {e}") from None

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self):  # noqa: N802
        self._handle("DELETE")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")
