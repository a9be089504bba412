"""Bad input: every entry of the list stops ALL ranks with its clear error, and the loaders never fail
with anything but GraphFormatError (hypothesis fuzzing).

The multi-rank cases run `launch/mpirun.sh -np 2` (subprocess with a timeout): every rank must
fail, the error must be printed once (by rank 0), the exit code must be non-zero, without a traceback.
"""
import contextlib
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgg.data import Graph, GraphFormatError, load_dataset, load_edgelist, load_npz, save_npz
from mgg.runtime import Communicator
from mgg.train import TrainConfig, train

from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env as env

def mpirun(np_, *args):
    return subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), "-np", str(np_), "--backend", "cpu",
                           "--epochs", "2", *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, errors="replace")


def tiny(**over) -> dict:
    """A valid 4-node CSR graph as npz arrays."""
    a = {"indptr": np.array([0, 1, 3, 4, 5]), "indices": np.array([1, 0, 2, 1, 2]),
         "x": np.eye(4, dtype=np.float32), "y": np.array([0, 1, 0, 1])}
    a.update(over)
    return {k: v for k, v in a.items() if v is not None}


def write_npz(path, **arrays):
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return str(path)


def make_case(name, d: Path) -> tuple[list[str], str]:
    """(extra CLI args, the text every rank's error must contain) for bad-input entry `name`."""
    good = write_npz(d / "good.npz", **tiny())
    if name == "truncated-npz":
        data = Path(good).read_bytes()
        (d / "t.npz").write_bytes(data[: len(data) // 2])
        return ["--dataset", str(d / "t.npz")], "truncated"
    if name == "corrupt-npz":
        np.savez_compressed(d / "c.npz", **tiny(x=np.random.default_rng(0).random((4, 64), dtype=np.float32)))
        data = bytearray((d / "c.npz").read_bytes())
        info = zipfile.ZipFile(d / "c.npz").getinfo("x.npy")
        for k in range(info.header_offset + 60, info.header_offset + 120):  # inside x's deflate stream
            data[k] ^= 0xFF
        (d / "c.npz").write_bytes(bytes(data))
        return ["--dataset", str(d / "c.npz")], "c.npz: file:"
    if name == "id-out-of-range":
        return ["--dataset", write_npz(d / "o.npz", **tiny(indices=np.array([1, 0, 9, 1, 2])))], \
            "indices[2]=9 is out of range for 4 nodes"
    if name == "negative-id":
        return ["--dataset", write_npz(d / "n.npz", **tiny(indices=np.array([1, -3, 2, 1, 2])))], \
            "indices[1]=-3 is negative"
    if name == "edge-id-out-of-range":
        p = write_npz(d / "e.npz", edge_index=np.array([[0, 1, 7], [1, 0, 0]]), num_nodes=np.int64(3),
                      y=None)
        return ["--dataset", p], "edge_index[0][2]=7 is out of range for 3 nodes"
    if name == "wrong-dtype":
        return ["--dataset", write_npz(d / "w.npz", **tiny(indices=np.array([1.0, 0, 2, 1, 2])))], \
            "indices: dtype float64 is not an integer type"
    if name == "wrong-dtype-x":
        return ["--dataset", write_npz(d / "wx.npz", **tiny(x=np.array(["a", "b", "c", "d"])))], \
            "x: dtype <U1 is not numeric"
    if name == "ragged-csr":
        return ["--dataset", write_npz(d / "r.npz", **tiny(indptr=np.array([0, 3, 1, 4, 5])))], \
            "indptr not monotone at position 2"
    if name == "csr-length-mismatch":
        return ["--dataset", write_npz(d / "l.npz", **tiny(indptr=np.array([0, 1, 3, 4, 7])))], \
            "indptr[-1]=7 but indices has 5 entries"
    if name == "empty-graph":
        return ["--dataset", write_npz(d / "z.npz", indptr=np.array([0]), indices=np.zeros(0, np.int64))], \
            "empty graph"
    if name == "nan-features":
        x = np.eye(4, dtype=np.float32)
        x[2, 1] = np.nan
        return ["--dataset", write_npz(d / "nan.npz", **tiny(x=x))], "x contains NaN at row 2"
    if name == "inf-features":
        x = np.eye(4, dtype=np.float32)
        x[3, 0] = -np.inf
        return ["--dataset", write_npz(d / "inf.npz", **tiny(x=x))], "x contains inf at row 3"
    if name == "no-labels":
        return ["--dataset", write_npz(d / "nl.npz", **tiny(y=None))], "has no labels"
    if name == "bad-edgelist":
        (d / "g.txt").write_text("0 1\n1 2\n2 x\n")
        return ["--dataset", str(d / "g.txt")], "line 3: token 'x' is not an integer"
    if name == "bad-gzip":
        (d / "g.txt.gz").write_bytes(gzip.compress(b"0 1\n1 2\n" * 50)[:30])
        return ["--dataset", str(d / "g.txt.gz")], "g.txt.gz: edges:"
    if name == "damaged-user-ids":  # a relabelled file whose map back to the user's ids repeats an id
        return ["--dataset", write_npz(d / "u.npz", **tiny(user_ids=np.array([0, 2, 2, 3])))], \
            "user_ids: is not a permutation of [0, 4): user id 1 belongs to no node"
    if name == "unknown-option":
        return ["--frobnicate", "3"], "unrecognized arguments: --frobnicate"
    if name == "ps-out-of-range":
        return ["--ps", "0"], "argument --ps: must be an integer in [1, 1024], got 0"
    if name == "dist-out-of-range":
        return ["--dist", "17"], "argument --dist: must be an integer in [1, 16], got 17"
    if name == "wpb-out-of-range":
        return ["--wpb", "33"], "argument --wpb: must be an integer in [1, 32], got 33"
    if name == "ps-inter-out-of-range":
        return ["--ps-inter", "4096"], "argument --ps-inter: must be an integer in [1, 1024]"
    if name == "label-beyond-classes":  # row 3 lies in rank 1's share of the rows
        return ["--dataset", write_npz(d / "lb.npz", **tiny(y=np.array([0, 1, 0, 100000])))], \
            "y[3]=100000 implies 100001 classes, but only 3 distinct labels occur"
    if name == "label-beyond-num-classes":
        return ["--dataset", write_npz(d / "ln.npz", **tiny(y=np.array([0, 1, 5, 1]))), "--num-classes", "2"], \
            "y[2]=5 is not below --num-classes 2"
    if name == "label-below-minus-one":
        return ["--dataset", write_npz(d / "lm.npz", **tiny(y=np.array([0, -4, 0, 1])))], "y[1]=-4 is below -1"
    if name == "metrics-json-unwritable":  # a path below a regular file: refused even as root
        (d / "file").write_text("")
        return ["--metrics-json", str(d / "file" / "m.json")], \
            f"--metrics-json {d / 'file' / 'm.json'}: cannot write into {d / 'file'}: {d / 'file'} is not a folder"
    if name == "metrics-json-is-a-folder":
        return ["--metrics-json", str(d)], f"--metrics-json {d}: is a folder; give a file name"
    if name == "checkpoint-dir-unwritable":
        (d / "file").write_text("")
        return ["--checkpoint-dir", str(d / "file" / "ck")], \
            f"--checkpoint-dir {d / 'file' / 'ck'}: cannot write into {d / 'file' / 'ck'}: {d / 'file'} is not a folder"
    if name == "checkpoint-dir-is-a-file":
        (d / "file").write_text("")
        return ["--checkpoint-dir", str(d / "file")], f"--checkpoint-dir {d / 'file'}: exists and is not a folder"
    if name == "diverging-loss":  # the loss of the default graph is nan by the second epoch
        return ["--lr", "1e30", "--epochs", "3"], "training diverged: the loss of epoch 2 is nan"
    if name == "checkpoint-of-another-run":
        # a 1-rank checkpoint of another graph: both mismatches are named
        ck = d / "ck"
        train(TrainConfig(epochs=1, backend="cpu", progress=False, checkpoint_dir=str(ck)),
              Communicator(comm=None), load_dataset("default"))
        return ["--dataset", good, "--epochs", "3", "--resume", str(ck / "checkpoint.mgg")], \
            "belongs to another run: graph fingerprint"
    raise KeyError(name)


CASES = ["truncated-npz", "corrupt-npz", "id-out-of-range", "negative-id", "edge-id-out-of-range",
         "wrong-dtype", "wrong-dtype-x", "ragged-csr", "csr-length-mismatch", "empty-graph",
         "nan-features", "inf-features", "no-labels", "bad-edgelist", "bad-gzip", "damaged-user-ids", "unknown-option",
         "ps-out-of-range", "dist-out-of-range", "wpb-out-of-range", "ps-inter-out-of-range",
         "checkpoint-of-another-run", "metrics-json-unwritable", "metrics-json-is-a-folder",
         "checkpoint-dir-unwritable", "checkpoint-dir-is-a-file", "label-beyond-classes",
         "label-beyond-num-classes", "label-below-minus-one", "diverging-loss"]
ARGPARSE = {"unknown-option", "ps-out-of-range", "dist-out-of-range", "wpb-out-of-range",
            "ps-inter-out-of-range"}


def check_rank_output(name, needle, stderr):
    """One error, once: every rank failed with it, rank 0 printed it (argparse's message for a flag)."""
    assert "Traceback" not in stderr, stderr
    assert stderr.count(needle) == 1, stderr
    errors = [ln for ln in stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and needle in errors[0], stderr
    if name not in ARGPARSE:
        assert errors[0].startswith("error: "), stderr


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_every_bad_input_fails_on_every_rank(tmp_path):
    """All entries in one `mpirun -np 2` job: each rank runs mgg.train.main(argv) per case (this
    file's __main__ driver) and reports its exit code and stderr; every rank must fail every case."""
    cases = {}
    for name in CASES:
        d = tmp_path / name
        d.mkdir()
        cases[name] = make_case(name, d)
    (tmp_path / "cases.json").write_text(json.dumps({k: v[0] for k, v in cases.items()}))
    r = subprocess.run([*MPIRUN, "-np", "2", sys.executable, "-m", __name__, str(tmp_path / "cases.json"),
                        str(tmp_path / "out.json")], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=PROCESS_TIMEOUT_S, errors="replace")
    assert r.returncode == 0, r.stdout + r.stderr  # no case hung: every rank came back from every case
    out = json.loads((tmp_path / "out.json").read_text())
    for name, (_, needle) in cases.items():
        for rank in range(2):
            code, err = out[str(rank)][name]
            assert code not in (0, None), (name, rank, err)
            if rank > 0:  # it failed too, and left the message to rank 0
                assert err == "", (name, rank, err)
                continue
            assert "Traceback" not in err and needle in err, (name, rank, err)
            if name not in ARGPARSE:
                assert err.startswith("error: ") and len(err.splitlines()) == 1, (name, err)


@pytest.mark.slow
@pytest.mark.needs_mpirun
@pytest.mark.parametrize("name", ["truncated-npz", "unknown-option", "checkpoint-of-another-run",
                                  "metrics-json-unwritable", "label-beyond-classes"])
def test_bad_input_ends_the_mpirun_job(tmp_path, name):
    """The same through the launcher: a non-zero exit of the whole job, the error once."""
    args, needle = make_case(name, tmp_path)
    r = mpirun(2, *args)
    assert r.returncode != 0, (r.returncode, r.stderr)
    check_rank_output(name, needle, r.stderr)


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_more_ranks_than_nodes_trains(tmp_path):
    """Not an error: ranks without nodes take part in every collective with empty slices."""
    p = write_npz(tmp_path / "two.npz", indptr=np.array([0, 1, 2]), indices=np.array([1, 0]),
                  x=np.eye(2, dtype=np.float32), y=np.array([0, 1]))
    r = mpirun(3, "--dataset", p)
    assert r.returncode == 0 and "ranks=3" in r.stdout, r.stderr


# -- fuzzing the loaders --------------------------------------------------------------------------
@contextlib.contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging: SIGALRM raises inside the loader."""
    def boom(signum, frame):
        raise TimeoutError(f"loader took more than {seconds} s")
    prev = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, prev)


def load_or_format_error(loader, path):
    """The loader's result (a validated Graph) or None when it raised GraphFormatError; any other
    exception type propagates and fails the test."""
    with time_limit(20):
        try:
            g = loader(path)
        except GraphFormatError as e:
            assert str(path) in str(e) or os.path.basename(str(path)) in str(e)
            return None
    assert isinstance(g, Graph) and g.num_nodes >= 1
    assert g.indptr.dtype == np.int64 and g.indices.dtype == np.int64
    assert g.indptr[0] == 0 and (np.diff(g.indptr) >= 0).all() and g.indptr[-1] == len(g.indices)
    assert ((g.indices >= 0) & (g.indices < g.num_nodes)).all()
    assert g.x is None or np.isfinite(g.x).all()
    return g


# CI: 60 fixed (derandomized) examples per test; MGG_FUZZ_EXAMPLES=N runs N random ones instead.
_N = int(os.environ.get("MGG_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_N or 60, deadline=None, derandomize=not _N, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_fuzz_dir = None


def fuzz_path(name):
    global _fuzz_dir
    if _fuzz_dir is None:
        import tempfile
        _fuzz_dir = tempfile.mkdtemp(prefix="mgg-fuzz-")
    return os.path.join(_fuzz_dir, name)


def valid_npz_bytes(compressed: bool) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **tiny(train_mask=np.array([1, 1, 0, 0], bool)))
    return buf.getvalue()


@FUZZ
@given(data=st.binary(max_size=2048), suffix=st.sampled_from([".npz", ".txt", ".csv", ".txt.gz", ".npz.gz"]))
def test_fuzz_random_bytes(data, suffix):
    p = fuzz_path("random" + suffix)
    Path(p).write_bytes(data)
    loader = load_npz if suffix == ".npz" else load_dataset
    load_or_format_error(loader, p)


@FUZZ
@given(compressed=st.booleans(), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                                                 min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_fuzz_mutated_npz(compressed, flips, cut):
    data = bytearray(valid_npz_bytes(compressed))
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    if cut is not None:
        data = data[: cut % len(data)]
    p = fuzz_path("mutated.npz")
    Path(p).write_bytes(bytes(data))
    load_or_format_error(load_npz, p)


_dtypes = st.sampled_from([np.int64, np.int32, np.uint8, np.uint64, np.float32, np.float64, np.bool_,
                           np.int8, "U3", np.complex64])


@st.composite
def arrays(draw, max_dim=3):
    dtype = np.dtype(draw(_dtypes))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=max_dim)))
    n = int(np.prod(shape)) if shape else 1
    raw = draw(st.lists(st.integers(-3, 9), min_size=n, max_size=n))
    if dtype.kind == "U":
        return np.array([str(v) for v in raw], dtype=dtype).reshape(shape)
    with np.errstate(all="ignore"):
        return np.array(raw).astype(dtype).reshape(shape)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(["indptr", "indices", "edge_index", "x", "y", "train_mask",
                                                "val_mask", "test_mask", "num_nodes"]),
                              arrays(), max_size=6))
def test_fuzz_npz_fields(fields):
    p = fuzz_path("fields.npz")
    np.savez(p, **fields)
    load_or_format_error(load_npz, p)


@FUZZ
@given(lines=st.lists(st.one_of(
    st.tuples(st.integers(-2, 12), st.integers(-2, 12)).map(lambda t: f"{t[0]} {t[1]}"),
    st.tuples(st.integers(0, 12), st.integers(0, 12)).map(lambda t: f"{t[0]},{t[1]}"),
    st.sampled_from(["# comment", "", "% c", "1", "1 2 3", "a b", "1\t2", "0x1 2", "1e3 2", " 3  4 "]),
    st.text(max_size=12)), max_size=20))
def test_fuzz_edgelist_text(lines):
    p = fuzz_path("fuzz.txt")
    Path(p).write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    load_or_format_error(load_edgelist, p)


def test_round_trip_survives_the_fuzz_checker(tmp_path):
    """The checker accepts a good file (the fuzz tests are not vacuous)."""
    g = load_npz(write_npz(tmp_path / "g.npz", **tiny()))
    save_npz(g, tmp_path / "h.npz")
    assert load_or_format_error(load_npz, tmp_path / "h.npz").num_edges == 5


def _driver(cases_path: str, out_path: str) -> None:
    """Under mpirun: run mgg.train.main(argv) for every case on every rank, record the exit code
    and what it printed on stderr, and write {rank: {case: [code, stderr]}} (rank 0)."""
    import contextlib as cl

    from mgg.runtime import world
    from mgg.train import main

    cases = json.loads(Path(cases_path).read_text())
    comm = world()
    mine = {}
    for name, args in cases.items():
        buf = io.StringIO()
        code = 0
        with cl.redirect_stderr(buf):
            try:
                main(["--backend", "cpu", "--epochs", "2", "--watchdog-timeout", "60", *args])
            except SystemExit as e:
                code = e.code
        comm.barrier()  # the next case starts together
        mine[name] = [code, buf.getvalue()]
    every = comm.allgather(mine)
    if comm.rank == 0:
        Path(out_path).write_text(json.dumps({str(r): v for r, v in enumerate(every)}))


if __name__ == "__main__":
    _driver(sys.argv[1], sys.argv[2])
