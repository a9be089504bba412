"""The service's HTTP front on rank 0: aiohttp's low-level server on its own event-loop thread,
feeding the batcher's queue.

What a client can make it do is bounded:

* connections: at most `max_connections` open (the soft fd limit is raised to fit); a new one
  beyond that closes the oldest connection that has no request being answered (idle keep-alive,
  partial headers, a body still arriving), or itself when every one is busy;
* time: a connection that has not sent a complete request `idle_timeout_s` after it opened or
  after its last answer is closed (slow or partial headers included); reading a body and writing
  an answer each get `io_timeout_s` (408 / the connection is dropped);
* HTTP framing is llhttp's: duplicate or malformed `Content-Length`, bad chunking and oversized
  header lines (`max_line_size` / `max_field_size`, 8 KiB) are a 400 (plain-text reason) and the
  connection is closed; a body the handler did not read closes the connection after the answer
  (`lingering_time=0`), so an unread body is never parsed as the next request;
* bodies: Content-Length required on lookups (411 otherwise, chunked refused), at most
  `max_body_bytes` (413 before a byte is read); a request with a body or a reply over
  LARGE_REQUEST_BYTES holds one of LARGE_REQUESTS_AT_ONCE slots while it is read, looked up and
  answered, so concurrent large requests cannot multiply rank 0's memory;
* per request: `max_bags` bags and `max_reply_bytes` of reply (`lookup_request`); a large JSON
  body's number lists are parsed by numpy (a few times the body, `json_body`); the batcher looks
  a large request up in parts between the others' passes; replies go out in WRITE_SLICE_BYTES
  slices, each waiting for the socket to drain.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import resource
import socket
import sys
import threading
import time
from typing import Any

import orjson
from aiohttp import web

from .batcher import CONTROL_SNAPSHOT, ControlJob, LookupJob
from .io import NAME_RE
from .lookup_request import (JSON_FIELDS, NPZ_ARRAYS, SMALL_JSON_BYTES, BadRequest, decode_json, decode_lookup_json,
                             decode_npz, encode_json_reply, encode_npy_reply, parse_lookup, reply_bytes_bound)

__all__ = ["HttpFront", "is_loopback", "LARGE_REQUEST_BYTES", "LARGE_REQUESTS_AT_ONCE"]

LARGE_REQUEST_BYTES = 1 << 20
LARGE_REQUESTS_AT_ONCE = 2
#: bodies and replies up to this size are decoded / encoded on the event loop, larger ones in a thread
INLINE_BYTES = 64 << 10
#: replies are handed to the transport in slices of this size
WRITE_SLICE_BYTES = 256 << 10
FD_RESERVE = 128  # descriptors kept for table files, MPI and the rest

ROUTES = {("GET", "/v1/health"), ("GET", "/v1/metrics"), ("POST", "/v1/lookup"), ("POST", "/v1/lookup/npy"),
          ("POST", "/v1/snapshot"), ("POST", "/v1/shutdown")}

_quiet = logging.getLogger("mgg.serve.http")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def raise_fd_limit(want: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `want` (up to the hard limit); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(hard, want)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft


class _Server(web.Server):
    """aiohttp's low-level server with the connection limit: the oldest evictable connection
    makes room for a new one."""

    def __init__(self, handler, *, front: "HttpFront", **kwargs):
        super().__init__(handler, **kwargs)
        self.front = front
        self.opened: dict[Any, None] = {}  # insertion order = age

    def connection_made(self, handler, transport) -> None:
        super().connection_made(handler, transport)
        self.opened[handler] = None
        m = self.front.metrics
        if len(self.opened) <= self.front.max_connections:
            m.connection("opened", len(self.opened))
            return
        busy = self.front.busy
        victim = next((h for h in self.opened if h not in busy and h is not handler), None)
        event = "evicted" if victim is not None else "refused"
        victim = victim or handler
        self.opened.pop(victim, None)
        victim.force_close()
        m.connection(event, len(self.opened))

    def connection_lost(self, handler, exc=None) -> None:
        super().connection_lost(handler, exc)
        self.opened.pop(handler, None)
        self.front.metrics.connection("closed", len(self.opened))


class HttpFront:
    """Binds in the caller's thread (`bind`, errors as OSError), serves on its own thread
    (`start` / `stop`). `svc` is the `EmbeddingService` it fronts."""

    def __init__(self, svc):
        self.svc, self.cfg, self.metrics = svc, svc.cfg, svc.metrics
        self.busy: set = set()  # connections whose request is being looked up / answered
        self.sock: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.max_connections = self.cfg.max_connections

    # -- lifecycle ---------------------------------------------------------------------------------
    def bind(self) -> tuple[str, int]:
        soft = raise_fd_limit(self.cfg.max_connections + FD_RESERVE)
        if soft != resource.RLIM_INFINITY and soft - FD_RESERVE < self.cfg.max_connections:
            self.max_connections = max(16, soft - FD_RESERVE)
            print(f"mgg.serve: warning: the open-file limit ({soft}) allows {self.max_connections} connections, "
                  f"not --max-connections={self.cfg.max_connections}", file=sys.stderr, flush=True)
        try:
            self.sock = socket.create_server((self.cfg.host, self.cfg.port), backlog=self._backlog())
        except OSError as e:
            raise OSError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e.strerror or e}") from None
        return self.sock.getsockname()[:2]

    def _backlog(self) -> int:
        try:
            with open("/proc/sys/net/core/somaxconn") as f:
                cap = int(f.read())
        except (OSError, ValueError):
            cap = 4096
        return max(128, min(cap, self.max_connections))

    def start(self) -> None:
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), name="mgg-serve-http", daemon=True)
        self.thread.start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        self.loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.large = asyncio.Semaphore(LARGE_REQUESTS_AT_ONCE)

        async def up():
            self.server = _Server(self.handle, front=self, loop=loop, keepalive_timeout=self.cfg.idle_timeout_s,
                                  lingering_time=0, logger=_quiet, access_log=None, max_line_size=8190,
                                  max_field_size=8190)
            self.aserver = await loop.create_server(self.server, sock=self.sock, backlog=self._backlog())

        loop.run_until_complete(up())
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        if self.loop is None or self.thread is None:
            if self.sock is not None:
                self.sock.close()
            return

        async def down():
            self.aserver.close()
            for h in list(self.server.opened):
                h.force_close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(down()))
        self.thread.join(timeout=10)

    # -- plumbing ----------------------------------------------------------------------------------
    async def _offload(self, size: int, fn, *args):
        """fn(*args) inline when `size` is small, else on a worker thread (the loop stays free
        between the thread's bytecodes)."""
        if size <= INLINE_BYTES:
            return fn(*args)
        return await self.loop.run_in_executor(None, fn, *args)

    def _authorized(self, request: web.BaseRequest) -> bool:
        import hmac

        token = self.cfg.token
        if not token:
            return True
        got = request.headers.get("Authorization", "")
        got = got[7:] if got.startswith("Bearer ") else request.headers.get("X-Auth-Token", "")
        return hmac.compare_digest(got.encode(), token.encode())

    async def _body(self, request: web.BaseRequest, bodiless_ok: bool = False) -> bytes:
        """The request body (Content-Length bytes, within io_timeout_s). Without Content-Length
        (and not chunked) an HTTP/1.1 request has no body: `bodiless_ok` endpoints (snapshot,
        shutdown: `curl -X POST`) get b"", the others answer 411."""
        limit = self.cfg.max_body_bytes
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            raise BadRequest(411, "chunked bodies are not accepted; send Content-Length")
        n = request.content_length  # a single, well-formed Content-Length: llhttp refuses the rest
        if n is None:
            if bodiless_ok:
                return b""
            raise BadRequest(411, "Content-Length is required")
        if n > limit:
            raise BadRequest(413, f"body of {n} bytes exceeds --max-body-bytes={limit}")
        try:
            return await asyncio.wait_for(request.content.readexactly(n), self.cfg.io_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(408, f"the body did not arrive within {self.cfg.io_timeout_s:g} s") from None
        except asyncio.IncompleteReadError:
            raise BadRequest(400, "truncated body") from None
        except ConnectionError:
            raise BadRequest(400, "the connection closed before the body arrived") from None

    async def _send(self, request: web.BaseRequest, status: int, body: bytes | list, ctype: str,
                    close: bool) -> web.StreamResponse:
        """Answer with `body` (bytes, or a list of bytes-like pieces written in order)."""
        parts = [memoryview(p).cast("B") for p in ([body] if isinstance(body, bytes) else body)]
        resp = web.StreamResponse(status=status, headers={"Content-Type": ctype, "Server": "mgg-serve/0.2"})
        resp.content_length = sum(p.nbytes for p in parts)
        if close or not request.content.is_eof():
            resp.force_close()
        try:
            await asyncio.wait_for(self._write(request, resp, parts), self.cfg.io_timeout_s)
        except (asyncio.TimeoutError, ConnectionError):
            if request.transport is not None:
                request.transport.abort()
        return resp

    @staticmethod
    async def _write(request, resp, parts: list[memoryview]) -> None:
        """Write in slices of WRITE_SLICE_BYTES, each waiting for the socket to drain: a large
        reply is copied into the transport a slice at a time between the other connections' work."""
        await resp.prepare(request)
        for p in parts:
            for a in range(0, p.nbytes, WRITE_SLICE_BYTES):
                await resp.write(p[a: a + WRITE_SLICE_BYTES])
        await resp.write_eof()

    # -- requests ----------------------------------------------------------------------------------
    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        t0 = time.perf_counter()
        method, path = request.method, request.path
        endpoint = f"{method} {path}" if (method, path) in ROUTES else f"{method} (unknown)"
        status, timed, close, slot = 200, path.startswith("/v1/lookup"), False, None
        try:
            if (method, path) not in ROUTES:
                raise BadRequest(405 if path in {p for _, p in ROUTES} else 404, f"no endpoint {method} {path}")
            if path != "/v1/health" and not self._authorized(request):
                raise BadRequest(401, "missing or wrong token (Authorization: Bearer TOKEN)")
            if path.startswith("/v1/lookup"):
                n = request.content_length or 0
                if n > LARGE_REQUEST_BYTES and n <= self.cfg.max_body_bytes:
                    slot = await self._large_slot()
                body, ctype = await self._lookup(request, slot)
            else:
                body, ctype, close = await self._other(request, path)
        except BadRequest as e:
            status, ctype = e.status, "application/json"
            body = orjson.dumps({"error": str(e), "status": e.status})
        except Exception as e:  # noqa: BLE001 - a handler never takes the service down
            status, ctype = 500, "application/json"
            body = orjson.dumps({"error": f"internal error: {type(e).__name__}: {e}", "status": 500})
        finally:
            if slot is not None:
                slot.release()
        try:
            self.busy.add(request.protocol)
            resp = await self._send(request, status, body, ctype, close)
        finally:
            self.busy.discard(request.protocol)
            self.metrics.record(endpoint, status, time.perf_counter() - t0 if timed else None)
        if path == "/v1/shutdown" and status == 200:
            self.svc.stop_event.set()  # after the answer is out: the batcher then stops every rank
        return resp  # already sent: aiohttp's finishing of it is a no-op

    async def _large_slot(self):
        try:
            await asyncio.wait_for(self.large.acquire(), self.cfg.request_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(503, f"busy: {LARGE_REQUESTS_AT_ONCE} large requests in progress") from None
        return self.large

    async def _lookup(self, request: web.BaseRequest, slot) -> tuple[bytes, str]:
        svc, cfg = self.svc, self.cfg
        raw = await self._body(request)
        self.busy.add(request.protocol)
        try:
            if request.path == "/v1/lookup":
                fmt = "json"
                doc = await self._offload(len(raw), decode_lookup_json, raw)
                unknown = set(doc) - JSON_FIELDS
                if unknown:
                    raise BadRequest(400, f"unknown fields {sorted(unknown)}")
                fields = (doc.get("table"), doc.get("indices"), doc.get("offsets"), doc.get("per_sample_weights"))
            else:
                fmt = "npy"
                arrays = await self._offload(len(raw), decode_npz, raw, cfg.max_body_bytes)
                unknown = set(arrays) - NPZ_ARRAYS
                if unknown:
                    raise BadRequest(400, f"unknown arrays {sorted(unknown)} in the npz body")
                fields = (request.query.get("table"), arrays.get("indices"), arrays.get("offsets"),
                          arrays.get("per_sample_weights"))
            del raw
            req = await self._offload(LARGE_REQUEST_BYTES, parse_lookup, svc.bag.tables, svc.names, *fields,
                                      svc.limits, fmt)
            reply_bound = reply_bytes_bound(req.bag.num_bags, req.dim, fmt)
            if slot is None and reply_bound > LARGE_REQUEST_BYTES:
                slot = await self._large_slot()
                try:
                    out = await self._submit(req)
                finally:
                    slot.release()
            else:
                out = await self._submit(req)
            if fmt == "json":
                return await self._offload(reply_bound, encode_json_reply, req.name, out), "application/json"
            return await self._offload(reply_bound, encode_npy_reply, out), "application/x-npy"
        finally:
            self.busy.discard(request.protocol)

    async def _submit(self, req) -> Any:
        svc = self.svc
        if svc.stop_event.is_set():
            raise BadRequest(503, "service is shutting down")
        unhealthy = svc.ranks_problem()
        if unhealthy:
            raise BadRequest(503, unhealthy)
        fut = self.loop.create_future()
        job = LookupJob(req, lambda j: self.loop.call_soon_threadsafe(_resolve, fut, j))
        svc.batcher.submit(job)
        try:
            j = await asyncio.wait_for(asyncio.shield(fut), self.cfg.request_timeout_s)
        except asyncio.TimeoutError:
            job.cancelled = True
            raise BadRequest(504, "lookup timed out") from None
        if j.error is not None:
            raise j.error
        return j.out

    async def _control(self, op: str, arg=None) -> Any:
        fut = self.loop.create_future()
        self.svc.batcher.submit(ControlJob(op, arg, lambda j: self.loop.call_soon_threadsafe(_resolve, fut, j)))
        try:
            j = await asyncio.wait_for(asyncio.shield(fut), self.cfg.request_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(504, "snapshot still running; it will complete") from None
        if j.error is not None:
            raise j.error
        return j.result

    async def _other(self, request: web.BaseRequest, path: str) -> tuple[bytes, str, bool]:
        svc = self.svc
        js = "application/json"
        if path == "/v1/health":
            h = svc.health()
            if h["status"] != "ok":
                raise BadRequest(503, h["reason"])
            return orjson.dumps(h), js, False
        if path == "/v1/metrics":
            return orjson.dumps(svc.metrics.snapshot()), js, False
        if path == "/v1/snapshot":
            raw = await self._body(request, bodiless_ok=True)
            if len(raw) > SMALL_JSON_BYTES:
                raise BadRequest(413, f"a snapshot body holds a name: at most {SMALL_JSON_BYTES} bytes")
            doc = decode_json(raw) if raw else {}
            name = doc.get("name") or time.strftime("snapshot-%Y%m%d-%H%M%S")
            if not isinstance(name, str) or not NAME_RE.match(name) or name in (".", ".."):
                raise BadRequest(400, f"snapshot name must match {NAME_RE.pattern}")
            if svc.stop_event.is_set():
                raise BadRequest(503, "service is shutting down")
            res = await self._control(CONTROL_SNAPSHOT, os.path.join(os.path.abspath(self.cfg.snapshot_dir), name))
            return orjson.dumps(res), js, False
        # /v1/shutdown
        await self._body(request, bodiless_ok=True)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if not self.cfg.token and not (peer and is_loopback(peer[0])):
            raise BadRequest(403, "shutdown without a token is only allowed from loopback")
        return orjson.dumps({"status": "stopping"}), js, True


def _resolve(fut: asyncio.Future, job) -> None:
    if not fut.done():
        fut.set_result(job)
