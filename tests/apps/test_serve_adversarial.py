"""The lookup service against adversarial clients and faults (`mpirun -np 2 python -m mgg.serve`).

Every bad input (malformed framing, smuggling attempts, amplification, nesting, slow and
half-open connections) is sent beside well-behaved clients whose every result is checked against
a float64 numpy lookup: no wrong result, no 5xx for a well-formed request, every bad request a
4xx naming its reason. A stopped rank turns health to failing and ends the service through the
watchdog. Assertions are on what was served and answered, not on wall time (the box is shared).
"""
import concurrent.futures as cf
import json
import os
import signal
import socket
import threading
import time
import zipfile
import io

import numpy as np
import pytest

from mgg.testing.serve import ServiceProcess, bag_reference, npz_bytes, peak_rss_bytes, rank_pids, reset_peak_rss

from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, subprocess_env

pytestmark = [pytest.mark.needs_mpirun, pytest.mark.slow]

TOKEN = "adv-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMITS = ["--max-body-bytes", "400000", "--max-bags", "2048", "--max-reply-bytes", "60000",
          "--max-batch-ids", "2048", "--idle-timeout", "3", "--io-timeout", "3"]
MODES = {"a": "sum", "b": "max", "c": "mean"}


def launch(tables_json, *extra):
    return ServiceProcess([*MPIRUN, "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-np", "2"], tables_json, *extra,
                          env=subprocess_env(), cwd=ROOT)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("advtables")
    rng = np.random.default_rng(7)
    W = {"a": rng.standard_normal((1000, 8)).astype(np.float32), "b": rng.standard_normal((77, 4)).astype(np.float32),
         "c": rng.standard_normal((50, 3)).astype(np.float32)}
    for k, w in W.items():
        np.save(d / f"{k}.npy", w)
    (d / "tables.json").write_text(json.dumps({"tables": [
        {"name": "a", "path": "a.npy", "mode": "sum", "sharding": "range"},
        {"name": "b", "path": "b.npy", "mode": "max", "sharding": "hash"},
        {"name": "c", "path": "c.npy", "mode": "mean", "sharding": "hash"}]}))
    return d, W


@pytest.fixture(scope="module")
def svc(tables):
    s = launch(tables[0] / "tables.json", "--auth-token", TOKEN, *LIMITS)
    yield s
    s.close()


# -- raw HTTP ----------------------------------------------------------------------------------------
def http_bytes(method, path, body=b"", headers=None, auth=True, length=True):
    h = {"Host": "x", **(AUTH if auth else {}), **(headers or {})}
    if length and "Content-Length" not in h and (body or method == "POST"):
        h["Content-Length"] = str(len(body))
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode() + body


def parse_responses(data: bytes) -> list[tuple[int, bytes]]:
    """Every complete HTTP response in a byte stream, in order."""
    out = []
    while data.startswith(b"HTTP/1."):
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        n = next((int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k.strip().lower() == b"content-length"), 0)
        out.append((status, rest[:n]))
        data = rest[n:]
    return out


def exchange(svc, payload: bytes, read_s: float = 2.0, close_write=False) -> tuple[list[tuple[int, bytes]], bool]:
    """Send raw bytes; the responses that came back within `read_s` of the last byte, and whether
    the service closed the connection."""
    s = socket.create_connection((svc.host, svc.port), timeout=30)
    try:
        s.sendall(payload)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        s.settimeout(read_s)
        data, closed = b"", False
        try:
            while True:
                chunk = s.recv(1 << 16)
                if not chunk:
                    closed = True
                    break
                data += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    finally:
        s.close()
    return parse_responses(data), closed


# -- well-behaved clients ----------------------------------------------------------------------------
class GoodClients:
    """Threads doing lookups (JSON and npz, every table) in a loop until stopped; every reply is
    compared with the numpy reference."""

    def __init__(self, svc, W, threads=4, seed=0):
        self.svc, self.W, self.stop = svc, W, threading.Event()
        self.ok = self.wrong = 0
        self.bad_status: list = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(seed + i,), daemon=True) for i in range(threads)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def one(self, rng):
        name = "abc"[int(rng.integers(3))]
        idx = rng.integers(0, self.W[name].shape[0], int(rng.integers(1, 40)))
        cuts = np.sort(rng.integers(0, len(idx) + 1, int(rng.integers(0, 6))))
        off = np.concatenate([[0], cuts]).astype(np.int64)
        if rng.random() < 0.5:
            st, data = self.svc.raw("POST", "/v1/lookup", json.dumps({"table": name, "indices": idx.tolist(),
                                                                      "offsets": off.tolist()}).encode(), AUTH)
            got = np.asarray(json.loads(data)["embeddings"], dtype=np.float32) if st == 200 else None
        else:
            st, data = self.svc.raw("POST", f"/v1/lookup/npy?table={name}", npz_bytes(indices=idx, offsets=off), AUTH)
            got = np.load(io.BytesIO(data)) if st == 200 else None
        with self.lock:
            if st != 200:
                self.bad_status.append((st, data[:200]))
            elif got.shape == (len(off), self.W[name].shape[1]) and np.allclose(
                    got, bag_reference(self.W[name], idx, off, MODES[name]), rtol=1e-5, atol=1e-5):
                self.ok += 1
            else:
                self.wrong += 1

    def _loop(self, seed):
        rng = np.random.default_rng(seed)
        while not self.stop.is_set():
            try:
                self.one(rng)
            except Exception as e:  # noqa: BLE001 - counted as a failure to serve
                with self.lock:
                    self.bad_status.append(("exception", repr(e)))

    def check(self, at_least=1):
        assert self.wrong == 0, f"{self.wrong} wrong results"
        assert not self.bad_status, self.bad_status[:5]
        assert self.ok >= at_least


# -- bad requests: (name, raw request bytes, expected status, reason substring) ------------------------
def zip_bomb() -> bytes:
    z = io.BytesIO()
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("indices.npy", b"\0" * 5_000_000)
    return z.getvalue()


def lookup(doc) -> bytes:
    return http_bytes("POST", "/v1/lookup", json.dumps(doc).encode())


SMUGGLED = b"GET /v1/metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
BAD = [
    ("zero bags json", lookup({"table": "a", "indices": [5, 6], "offsets": []}), 400, "0 bags"),
    ("zero bags npz", http_bytes("POST", "/v1/lookup/npy?table=a",
                                 npz_bytes(indices=np.array([5, 6]), offsets=np.zeros(0, np.int64))), 400, "0 bags"),
    ("bags over --max-bags", lookup({"table": "a", "indices": [], "offsets": [0] * 50000}), 413, "--max-bags=2048"),
    ("npz bags over --max-bags", http_bytes("POST", "/v1/lookup/npy?table=a", npz_bytes(
        indices=np.zeros(0, np.int64), offsets=np.zeros(40000, np.int64))), 413, "--max-bags=2048"),
    ("reply over --max-reply-bytes", lookup({"table": "a", "indices": [], "offsets": [0] * 2000}), 413,
     "--max-reply-bytes=60000"),
    ("body over --max-body-bytes", http_bytes("POST", "/v1/lookup", b" " * 400001), 413, "--max-body-bytes=400000"),
    ("npz expanding past the limit", http_bytes("POST", "/v1/lookup/npy?table=a", zip_bomb()), 413, "expands"),
    ("deep nesting", http_bytes("POST", "/v1/lookup", b"[" * 100000 + b"]" * 100000), 400, "nested deeper"),
    ("deep nesting in a field", http_bytes("POST", "/v1/lookup", b'{"table": "a", "indices": ' + b"[" * 5000
                                           + b"]" * 5000 + b', "offsets": [0]}'), 400, "nested deeper"),
    ("NaN", http_bytes("POST", "/v1/lookup", b'{"table": "a", "indices": [NaN], "offsets": [0]}'), 400, "malformed JSON"),
    ("invalid UTF-8", http_bytes("POST", "/v1/lookup", b'{"table": "\xff", "indices": [1], "offsets": [0]}'), 400,
     "malformed JSON"),
    ("ids out of range", lookup({"table": "a", "indices": [1000], "offsets": [0]}), 422, "out of range"),
    ("float ids", lookup({"table": "a", "indices": [1.5], "offsets": [0]}), 400, "integers"),
    ("huge id", http_bytes("POST", "/v1/lookup", b'{"table": "a", "indices": [99999999999999999999999], '
                                                  b'"offsets": [0]}'), 400, ""),
    ("unknown table", lookup({"table": "zz", "indices": [1], "offsets": [0]}), 404, "unknown table"),
    ("duplicate Content-Length", http_bytes("POST", "/v1/lookup", b"{}", {"Content-Length": "2\r\nContent-Length: 2"}),
     400, "Content-Length"),
    ("conflicting Content-Length", http_bytes("POST", "/v1/lookup", b"{}", {"Content-Length": "2\r\nContent-Length: 9"}),
     400, "Content-Length"),
    ("negative Content-Length", http_bytes("POST", "/v1/lookup", b"{}", {"Content-Length": "-2"}), 400, "Content-Length"),
    ("Content-Length with Transfer-Encoding", http_bytes("POST", "/v1/lookup", b"{}", {"Transfer-Encoding": "chunked"}),
     400, "Transfer-Encoding"),
    ("chunked body", http_bytes("POST", "/v1/lookup", b"2\r\n{}\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"},
                                length=False), 411, "chunked"),
    ("no Content-Length", http_bytes("POST", "/v1/lookup", length=False), 411, "Content-Length"),
    ("header line too long", http_bytes("GET", "/v1/metrics", headers={"X-Long": "y" * 20000}), 400, "8190"),
    ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64) + b"\r\n\r\n", 400, ""),
    ("no token", http_bytes("POST", "/v1/lookup", b'{"table": "a", "indices": [1], "offsets": [0]}', auth=False),
     401, "token"),
    ("unknown endpoint", http_bytes("GET", "/v1/nothing"), 404, "no endpoint"),
    ("wrong method", http_bytes("GET", "/v1/lookup"), 405, "no endpoint"),
]


@pytest.mark.parametrize("name,payload,status,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_request_gets_4xx_with_reason(svc, name, payload, status, reason):
    responses, _ = exchange(svc, payload)
    assert len(responses) == 1, (name, responses)
    st, body = responses[0]
    assert st == status, (name, st, body[:300])
    assert reason.encode() in body, (name, body[:300])


@pytest.mark.parametrize("prefix,status", [
    (http_bytes("POST", "/nope", SMUGGLED), 404),
    (http_bytes("POST", "/v1/lookup", SMUGGLED, auth=False), 401),
    (http_bytes("GET", "/v1/lookup", SMUGGLED), 405),
    (http_bytes("POST", "/v1/lookup", b" " * 400001 + SMUGGLED), 413),
], ids=["404", "401", "405", "413"])
def test_unread_body_is_never_parsed_as_a_request(svc, prefix, status):
    """A refused request whose body holds another request: one answer, never the inner one."""
    responses, _ = exchange(svc, prefix)
    assert [r[0] for r in responses] == [status], responses


def test_pipelined_requests_answered_in_order(svc, tables):
    _, W = tables
    reqs = [({"table": "a", "indices": [3, 4, 5], "offsets": [0, 2]}), ({"table": "b", "indices": [7], "offsets": [0]})]
    responses, _ = exchange(svc, b"".join(lookup(d) for d in reqs) + http_bytes("GET", "/v1/health"))
    assert [r[0] for r in responses] == [200, 200, 200]
    for d, (_, body) in zip(reqs, responses):
        got = np.asarray(json.loads(body)["embeddings"], dtype=np.float32)
        np.testing.assert_allclose(got, bag_reference(W[d["table"]], d["indices"], d["offsets"], MODES[d["table"]]),
                                   rtol=1e-6, atol=1e-6)


def test_slow_and_truncated_bodies(svc):
    """A body that stops arriving gets 408 after --io-timeout; a connection that closes mid-body
    gets nothing (and costs nothing)."""
    responses, closed = exchange(svc, http_bytes("POST", "/v1/lookup", b"{" , {"Content-Length": "100"}), read_s=60)
    assert [r[0] for r in responses] == [408] and b"did not arrive" in responses[0][1] and closed
    responses, _ = exchange(svc, http_bytes("POST", "/v1/lookup", b"{", {"Content-Length": "100"}), close_write=True)
    assert responses == []


def test_idle_and_partial_connections_are_closed(svc):
    """A connection that sends nothing, or half a header, is closed by the service after --idle-timeout."""
    for payload in (b"", b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Le"):
        s = socket.create_connection((svc.host, svc.port), timeout=60)
        s.sendall(payload)
        assert s.recv(1024) == b""  # EOF from the service (within the 60 s socket timeout, not ours)
        s.close()


def test_bad_inputs_beside_good_clients(svc, tables):
    """Every bad input, over and over from 3 threads, beside 4 well-behaved clients."""
    _, W = tables
    failures = []

    def adversary(i):
        for name, payload, status, reason in BAD[i::3] * 3:
            responses, _ = exchange(svc, payload, read_s=5)
            if [r[0] for r in responses] != [status] or reason.encode() not in responses[0][1]:
                failures.append((name, responses[:1]))

    with GoodClients(svc, W) as good:
        with cf.ThreadPoolExecutor(3) as ex:
            list(ex.map(adversary, range(3)))
    good.check(at_least=20)
    assert not failures, failures[:5]
    st, data = svc.raw("GET", "/v1/metrics", headers=AUTH)
    assert not any(k.startswith("5") for k in json.loads(data)["errors"]), data


def maximal_request(fmt: str, rng) -> tuple[np.ndarray, np.ndarray, str, bytes]:
    """Just under --max-body-bytes=400000 with 400 bags (the most --max-reply-bytes allows at D = 8);
    JSON with 3-digit ids, the most Python ints per body byte."""
    n = 90_000 if fmt == "json" else 49_000
    idx = rng.integers(100, 1000, n)
    off = np.sort(rng.integers(0, n + 1, 400))
    off[0] = 0
    if fmt == "json":
        body = json.dumps({"table": "a", "indices": idx.tolist(), "offsets": off.tolist()}, separators=(",", ":"))
        return idx, off, "/v1/lookup", body.encode()
    return idx, off, "/v1/lookup/npy?table=a", npz_bytes(indices=idx, offsets=off)


@pytest.mark.parametrize("fmt,bound", [("json", 10), ("npz", 4)])
def test_maximal_request_is_split_and_bounded(svc, tables, fmt, bound):
    """The largest request the limits allow is answered correctly, looked up in several passes
    (--max-batch-ids) while small requests are answered beside it, and raises rank 0's
    peak memory by at most `bound` x its body (JSON: Python ints while parsing; npz: arrays)."""
    _, W = tables
    rng = np.random.default_rng(3)
    pid = json.loads(svc.raw("GET", "/v1/health")[1])["pid"]
    _, _, path, body = maximal_request(fmt, rng)
    assert svc.raw("POST", path, body, AUTH)[0] == 200  # warm-up: worker threads, allocator arenas
    idx, off, path, body = maximal_request(fmt, rng)
    assert 300_000 < len(body) <= 400_000
    before = json.loads(svc.raw("GET", "/v1/metrics", headers=AUTH)[1])
    with GoodClients(svc, W, threads=2) as good:
        time.sleep(0.5)
        reset_peak_rss(pid)
        rss0 = peak_rss_bytes(pid)
        st, data = svc.raw("POST", path, body, AUTH)
        grown = peak_rss_bytes(pid) - rss0
    good.check()
    assert st == 200, data[:300]
    got = np.asarray(json.loads(data)["embeddings"], dtype=np.float32) if fmt == "json" else np.load(io.BytesIO(data))
    np.testing.assert_allclose(got, bag_reference(W["a"], idx, off, "sum"), rtol=1e-4, atol=1e-4)
    after = json.loads(svc.raw("GET", "/v1/metrics", headers=AUTH)[1])
    assert after["lookup_passes"] - before["lookup_passes"] >= len(idx) // 2048  # split into passes
    assert grown <= bound * len(body), (grown, len(body))


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_bags_larger_than_a_pass_are_split_and_combined(svc, tables, name):
    """A bag of more ids than --max-batch-ids (sum, max and mean tables) is looked up in pieces
    over several passes and the pieces are combined into the same result as one lookup."""
    _, W = tables
    rng = np.random.default_rng(11)
    idx = rng.integers(0, W[name].shape[0], 30_000)
    off = np.array([0, 3, 3, 20_000])  # a small bag, an empty one, two larger than a pass
    before = json.loads(svc.raw("GET", "/v1/metrics", headers=AUTH)[1])
    with GoodClients(svc, W, threads=2) as good:
        st, data = svc.raw("POST", f"/v1/lookup/npy?table={name}", npz_bytes(indices=idx, offsets=off), AUTH)
    good.check()
    assert st == 200, data[:300]
    np.testing.assert_allclose(np.load(io.BytesIO(data)), bag_reference(W[name], idx, off, MODES[name]),
                               rtol=1e-4, atol=1e-4)
    after = json.loads(svc.raw("GET", "/v1/metrics", headers=AUTH)[1])
    assert after["lookup_passes"] - before["lookup_passes"] >= len(idx) // 2048


def test_2000_half_open_and_idle_connections(tables):
    """2,000 connections (half a header, or nothing at all) held and then dropped while a
    well-behaved client keeps looking up: every lookup is served and correct; then 600 more than
    --max-connections: the oldest idle ones are evicted and the client is still served."""
    _, W = tables
    s = launch(tables[0] / "tables.json", "--max-connections", "3000")
    try:
        socks = []
        with GoodClients(s, W, threads=1) as good:
            for i in range(2000):
                c = socket.create_connection((s.host, s.port), timeout=30)
                if i % 2:
                    c.sendall(b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Le")
                socks.append(c)
            held = json.loads(s.raw("GET", "/v1/metrics")[1])["connections"]
            n_during = good.ok
            time.sleep(2)
            for c in socks:
                c.close()
            time.sleep(2)
        good.check(at_least=n_during + 1)  # served while they were held and after
        assert held["open"] >= 2000 and held.get("evicted", 0) == 0, held
    finally:
        s.close()
    s = launch(tables[0] / "tables.json", "--max-connections", "400")
    try:
        socks = [socket.create_connection((s.host, s.port), timeout=30) for _ in range(1000)]
        with GoodClients(s, W, threads=1) as good:
            time.sleep(3)
        good.check()
        conns = json.loads(s.raw("GET", "/v1/metrics")[1])["connections"]
        assert conns["evicted"] >= 600 and conns["open"] <= 400, conns
        for c in socks:
            c.close()
    finally:
        s.close()


@pytest.mark.parametrize("stopped_rank", [1, 0])
def test_stopped_rank_fails_health_and_ends_service(tables, stopped_rank):
    """SIGSTOP of one rank: health answers 503 naming the ranks (while rank 0 still answers), and
    the watchdog ends the job with its message."""
    s = launch(tables[0] / "tables.json", "--watchdog-timeout", "8")
    try:
        assert s.raw("GET", "/v1/health")[0] == 200
        root = json.loads(s.raw("GET", "/v1/health")[1])["pid"]
        pids = rank_pids(s.proc.pid)
        assert len(pids) == 2 and root in pids, pids
        victim = root if stopped_rank == 0 else next(p for p in pids if p != root)
        os.kill(victim, signal.SIGSTOP)
        try:
            if stopped_rank == 1:
                seen = None
                while s.proc.poll() is None and seen is None:
                    try:
                        st, body = s.raw("GET", "/v1/health", timeout=5)
                    except OSError:
                        break
                    if st == 503:
                        seen = json.loads(body)["error"]
                    time.sleep(0.3)
                assert seen and "ranks not responding" in seen and "watchdog" in seen, seen
            rc = s.wait(timeout=300)
        finally:
            try:
                os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:
                pass
        err = s.proc.stderr.read()
        assert rc != 0 and "mgg watchdog" in err and "timeout 8 s" in err, err[-2000:]
        assert f"rank {1 - stopped_rank} waited" in err, err[-2000:]
    finally:
        s.close()
