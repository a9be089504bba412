"""The lookup service end to end: `mpirun -np 2 python -m mgg.serve` on a loopback port."""
import concurrent.futures as cf
import io
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from mgg.embedding.client import EmbeddingClient, ServiceError
from mgg.embedding.io import save_safetensors
from mgg.testing.serve import ServiceProcess, bag_reference, npz_bytes

from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env

pytestmark = [pytest.mark.needs_mpirun, pytest.mark.slow]  # every test here talks to an `mpirun ... mgg.serve`


def mpirun(np_: int, osc: bool = True) -> list[str]:
    """`osc=False`: no `--mca osc ^ucx` (the docs' plain `mpirun -np N` form)."""
    base = list(MPIRUN)
    if not osc:
        i = base.index("--mca")
        del base[i:i + 3]
    return [*base, "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-np", str(np_)]


def env(osc: bool = True) -> dict[str, str]:
    """The shared subprocess environment; `osc=False` leaves Open MPI's one-sided components alone."""
    e = subprocess_env()
    if not osc:
        del e["OMPI_MCA_osc"]
    return e


class Service(ServiceProcess):
    def __init__(self, tables_json, *extra, np_=2, osc=True):
        super().__init__(mpirun(np_, osc), tables_json, *extra, env=env(osc), cwd=ROOT, start_timeout=60)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    rng = np.random.default_rng(0)
    A = rng.standard_normal((1000, 8)).astype(np.float32)
    B = rng.standard_normal((77, 4)).astype(np.float32)
    C = rng.standard_normal((50, 3)).astype(np.float64)
    np.save(d / "a.npy", A)
    save_safetensors(str(d / "b.safetensors"), {"weight": B})
    np.save(d / "c.npy", C)
    (d / "tables.json").write_text(json.dumps({"tables": [
        {"name": "a", "path": "a.npy", "mode": "sum", "sharding": "range"},
        {"name": "b", "path": "b.safetensors", "mode": "max", "sharding": "hash"},
        {"name": "c", "path": "c.npy", "mode": "mean", "sharding": "hash"}]}))
    return d, {"a": A, "b": B, "c": C.astype(np.float32)}


@pytest.fixture(scope="module")
def svc(tables):
    d, _ = tables
    s = Service(d / "tables.json", "--max-body-bytes", "200000", "--snapshot-dir", str(d / "snaps"))
    yield s
    if s.proc.poll() is None:
        s.proc.send_signal(signal.SIGTERM)
        s.wait()


ref_bag = bag_reference


def test_lookups_match_numpy(svc, tables):
    _, W = tables
    c = EmbeddingClient(svc.url)
    h = c.health()
    assert h["status"] == "ok" and h["world_size"] == 2 and set(h["tables"]) == {"a", "b", "c"}
    rng = np.random.default_rng(1)
    for name, mode in (("a", "sum"), ("b", "max"), ("c", "mean")):
        n = W[name].shape[0]
        idx = rng.integers(0, n, 40)
        off = np.array([0, 5, 5, 17, 39])
        for binary in (True, False):
            got = c.lookup(name, idx, off, binary=binary)
            np.testing.assert_allclose(got, ref_bag(W[name], idx, off, mode), rtol=1e-5, atol=1e-6)
    psw = rng.random(40)
    np.testing.assert_allclose(c.lookup("a", idx % 1000, off, psw), ref_bag(W["a"], idx % 1000, off, "sum", psw),
                               rtol=1e-5, atol=1e-5)


BAD_JSON = [
    ({"table": "nope", "indices": [1], "offsets": [0]}, 404, "unknown table"),
    ({"table": "a", "indices": [1000], "offsets": [0]}, 422, "out of range"),
    ({"table": "a", "indices": [-1], "offsets": [0]}, 422, "out of range"),
    ({"table": "a", "indices": [1, 2], "offsets": [1]}, 400, "start at 0"),
    ({"table": "a", "indices": [1, 2, 3], "offsets": [0, 2, 1]}, 400, "non-decreasing"),
    ({"table": "a", "indices": [1, 2], "offsets": [0, 3]}, 400, "exceeds"),
    ({"table": "a", "indices": [1.5], "offsets": [0]}, 400, "integers"),
    ({"table": "a", "indices": ["1"], "offsets": [0]}, 400, "integers"),
    ({"table": "a", "indices": [True], "offsets": [0]}, 400, "integers"),
    ({"table": "a", "indices": [[1], [2, 3]], "offsets": [0]}, 400, "integers"),
    ({"table": "a", "indices": [1], "offsets": [0], "per_sample_weights": [1, 2]}, 400, "per_sample_weights"),
    ({"table": "b", "indices": [1], "offsets": [0], "per_sample_weights": [1.0]}, 400, "mode='sum'"),
    ({"table": "a", "indices": [1]}, 400, "required"),
    ({"table": "a", "indices": [5, 6], "offsets": []}, 400, "0 bags"),
    ({"table": 3, "indices": [1], "offsets": [0]}, 400, "string"),
    ({"table": "a", "indices": [1], "offsets": [0], "extra": 1}, 400, "unknown fields"),
    ([1, 2], 400, "object"),
]


@pytest.mark.parametrize("doc,status,msg", BAD_JSON)
def test_bad_json_requests_get_4xx(svc, doc, status, msg):
    st, body = svc.raw("POST", "/v1/lookup", json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert st == status and msg in json.loads(body)["error"]


npz = npz_bytes


def test_other_bad_requests_and_service_stays_up(svc, tables):
    cases = [
        (("POST", "/v1/lookup", b"{not json"), 400, "malformed JSON"),
        (("POST", "/v1/lookup", b'{"table": "a", "indices": [NaN], "offsets": [0]}'), 400, "malformed JSON"),
        (("POST", "/v1/lookup", b"x" * 200001), 413, "max-body-bytes"),
        (("POST", "/v1/lookup/npy?table=a", b"PK\x03\x04garbage"), 400, "malformed npz"),
        (("POST", "/v1/lookup/npy?table=a", npz(indices=np.array([0.5]), offsets=np.array([0]))), 400, "integers"),
        (("POST", "/v1/lookup/npy?table=a", npz(indices=np.array([1]))), 400, "required"),
        (("POST", "/v1/lookup/npy?table=zz", npz(indices=np.array([1]), offsets=np.array([0]))), 404, "unknown table"),
        (("POST", "/v1/lookup/npy", npz(indices=np.array([1]), offsets=np.array([0]))), 400, "string"),
        (("GET", "/v1/nothing", b""), 404, "no endpoint"),
        (("GET", "/v1/lookup", b""), 405, "no endpoint"),
        (("POST", "/v1/snapshot", b'{"name": "../evil"}'), 400, "snapshot name"),
    ]
    for (method, path, body), status, msg in cases:
        st, data = svc.raw(method, path, body)
        assert st == status, (path, st, data)
        assert msg in json.loads(data)["error"]
    z = io.BytesIO()  # a zip that expands far beyond the body limit
    import zipfile
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("indices.npy", b"\0" * 10_000_000)
    st, data = svc.raw("POST", "/v1/lookup/npy?table=a", z.getvalue())
    assert st == 413
    c = EmbeddingClient(svc.url)
    assert c.health()["status"] == "ok"
    np.testing.assert_allclose(c.lookup("a", [3], [0]), tables[1]["a"][[3]])
    with pytest.raises(ServiceError) as e:
        c.lookup("a", [5000], [0])
    assert e.value.status == 422


def test_concurrent_requests_batched_and_correct(svc, tables):
    _, W = tables
    c = EmbeddingClient(svc.url)
    before = c.metrics()

    def one(i):
        rng = np.random.default_rng(100 + i)
        name = "abc"[i % 3]
        mode = {"a": "sum", "b": "max", "c": "mean"}[name]
        idx = rng.integers(0, W[name].shape[0], 12)
        off = np.array([0, 4, 4, 9])
        return np.allclose(c.lookup(name, idx, off, binary=bool(i % 2)), ref_bag(W[name], idx, off, mode),
                           rtol=1e-5, atol=1e-6)

    with cf.ThreadPoolExecutor(16) as ex:
        assert all(ex.map(one, range(240)))
    m = c.metrics()
    assert m["requests"]["POST /v1/lookup/npy"] - before["requests"].get("POST /v1/lookup/npy", 0) == 120
    assert m["requests"]["POST /v1/lookup"] - before["requests"].get("POST /v1/lookup", 0) == 120
    assert m["batched_requests"] - before["batched_requests"] == 240
    assert m["batches"] - before["batches"] < 240  # concurrent requests shared lookups
    assert m["errors_total"] == before["errors_total"]
    assert m["lookup_latency_ms"]["p50"] <= m["lookup_latency_ms"]["p99"]


def test_zero_bag_requests_never_leak_ids_into_other_requests(svc, tables):
    """Requests with ids but no bags, sent between well-formed ones as JSON and npz, are refused
    with 400 and every well-formed request's bags hold exactly its own rows."""
    _, W = tables
    c = EmbeddingClient(svc.url)

    def good(i):
        rng = np.random.default_rng(500 + i)
        idx = rng.integers(0, W["a"].shape[0], 6)
        off = np.array([0, 1, 4])
        return np.allclose(c.lookup("a", idx, off, binary=bool(i % 2)), ref_bag(W["a"], idx, off, "sum"),
                           rtol=1e-5, atol=1e-6)

    def bad(i):
        if i % 2:
            st, data = svc.raw("POST", "/v1/lookup/npy?table=a",
                               npz(indices=np.array([5, 6]), offsets=np.zeros(0, dtype=np.int64)))
        else:
            st, data = svc.raw("POST", "/v1/lookup", json.dumps({"table": "a", "indices": [5, 6],
                                                                  "offsets": []}).encode())
        return st == 400 and "0 bags" in json.loads(data)["error"]

    with cf.ThreadPoolExecutor(12) as ex:
        goods = [ex.submit(good, i) for i in range(120)]
        bads = [ex.submit(bad, i) for i in range(60)]
        assert all(f.result() for f in goods)
        assert all(f.result() for f in bads)


def test_snapshot_is_atomic_and_reloadable(svc, tables):
    d, W = tables
    c = EmbeddingClient(svc.url)
    res = c.snapshot("s1")
    snap = d / "snaps" / "s1"
    assert res["path"] == str(snap / "tables.json")
    assert sorted(os.listdir(snap)) == ["a.npy", "b.npy", "c.npy", "tables.json"]  # no temp files left
    for k in W:
        assert np.array_equal(np.load(snap / f"{k}.npy"), W[k])
    s2 = Service(snap / "tables.json", np_=3)
    try:
        c2 = EmbeddingClient(s2.url)
        assert c2.health()["world_size"] == 3
        np.testing.assert_allclose(c2.lookup("b", [1, 76, 5], [0, 2]), ref_bag(W["b"], [1, 76, 5], [0, 2], "max"))
        c2.shutdown()
        assert s2.wait() == 0
    finally:
        if s2.proc.poll() is None:
            s2.proc.kill()


def test_token_and_sigterm_shutdown(tables):
    d, W = tables
    s = Service(d / "tables.json", "--auth-token", "s3cret")
    try:
        st, body = s.raw("POST", "/v1/lookup", json.dumps({"table": "a", "indices": [1], "offsets": [0]}).encode())
        assert st == 401
        assert s.raw("GET", "/v1/health")[0] == 200
        with pytest.raises(ServiceError) as e:
            EmbeddingClient(s.url, token="wrong").metrics()
        assert e.value.status == 401
        c = EmbeddingClient(s.url, token="s3cret")
        np.testing.assert_allclose(c.lookup("a", [7], [0]), W["a"][[7]])
        assert s.raw("POST", "/v1/shutdown", b"{}")[0] == 401
        os.kill(c.health()["pid"], signal.SIGTERM)  # SIGTERM on rank 0: every rank stops, exit 0
        assert s.wait(30) == 0
        assert "stopped" in s.proc.stdout.read()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_shutdown_endpoint_exits_zero(svc):
    c = EmbeddingClient(svc.url)
    assert c.shutdown()["status"] == "stopping"
    assert svc.wait(30) == 0


@pytest.mark.parametrize("extra,msg", [
    (["--host", "0.0.0.0"], "without --allow-remote"),
    (["--host", "0.0.0.0", "--allow-remote"], "without a token"),
])
def test_refuses_remote_bind_without_token(tables, extra, msg):
    d, _ = tables
    r = subprocess.run([sys.executable, "-m", "mgg.serve", "--tables", str(d / "tables.json"), *extra],
                       capture_output=True, text=True, env=env(), cwd=ROOT, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 2 and msg in r.stderr


def test_bad_tables_file_is_refused(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps([{"name": "x", "path": "missing.npy"}]))
    r = subprocess.run(mpirun(2) + [sys.executable, "-m", "mgg.serve", "--tables", str(tmp_path / "t.json"),
                                    "--port", "0"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode != 0 and "file not found" in r.stderr


def test_bodiless_posts_on_control_endpoints(tables):
    """`curl -X POST .../v1/shutdown` sends no Content-Length: control endpoints accept it, a lookup
    still needs a body (411)."""
    d, _ = tables
    s = Service(d / "tables.json", "--snapshot-dir", str(d / "bodiless"))
    try:
        st, data = s.bodiless_post("/v1/lookup")
        assert st == 411 and b"Content-Length" in data
        st, data = s.bodiless_post("/v1/snapshot")
        assert st == 200, data
        assert os.path.exists(json.loads(data)["path"])
        st, data = s.bodiless_post("/v1/shutdown")
        assert st == 200 and json.loads(data)["status"] == "stopping"
        assert s.wait(30) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


@pytest.mark.slow
def test_serve_and_dlrm_print_no_spurious_mpi_error(tables):
    """Plain `mpirun -np 2` (no --mca osc, no OMPI_MCA_osc): Open MPI 5's UCX one-sided component
    must not print "Error: OSC UCX component ..." on every rank."""
    d, _ = tables
    s = Service(d / "tables.json", osc=False)
    try:
        assert s.bodiless_post("/v1/shutdown")[0] == 200
        assert s.wait(30) == 0
        out = s.proc.stdout.read() + s.proc.stderr.read()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert "Error" not in out, out
    r = subprocess.run(mpirun(2, osc=False) + [sys.executable, "examples/dlrm.py", "--steps", "2",
                                               "--max-rows", "2000", "--batch-size", "64"],
                       capture_output=True, text=True, env=env(osc=False), cwd=ROOT, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "step" in r.stdout and "Error" not in r.stdout + r.stderr, r.stderr


def test_junk_npy_table_is_named_as_such(tmp_path):
    """A .npy path that holds no NumPy data is reported as that, not as a safetensors header
    problem."""
    (tmp_path / "junk.npy").write_bytes(b"this is not a table, just some text\n" * 4)
    (tmp_path / "t.json").write_text(json.dumps([{"name": "x", "path": "junk.npy"}]))
    r = subprocess.run(mpirun(2) + [sys.executable, "-m", "mgg.serve", "--tables", str(tmp_path / "t.json"),
                                    "--port", "0"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 2 and "is not a .npy file" in r.stderr, r.stderr
    assert "safetensors" not in r.stderr and "Traceback" not in r.stderr
