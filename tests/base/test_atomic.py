"""mgg/atomic.py: atomic writes give the mode `open(path, "w")` would."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mgg.atomic import atomic_path, atomic_write, atomic_write_json, current_umask, remove_stale_temporaries
from mgg.testing.paths import ROOT


def mode_of(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def umask():
    """Set a umask for one test, restored after."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda m: os.umask(m)
    os.umask(old)


def test_current_umask_reads_the_process_umask(umask):
    for m in (0o022, 0o077, 0o002):
        umask(m)
        assert current_umask() == m


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_new_files_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    # the reference: what a plain open() creates under the same umask
    with open(tmp_path / "plain", "w") as f:
        f.write("x")
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    atomic_write(tmp_path / "b.bin", lambda f: f.write(b"x"))
    atomic_path(tmp_path / "c.bin", lambda p: Path(p).write_bytes(b"x"))
    want = mode_of(tmp_path / "plain")
    assert want == 0o666 & ~mask
    for name in ("a.json", "b.bin", "c.bin"):
        assert mode_of(tmp_path / name) == want, name


def test_overwrite_keeps_the_existing_mode(tmp_path, umask):
    umask(0o022)
    p = tmp_path / "m.json"
    atomic_write_json(p, {"v": 1})
    os.chmod(p, 0o600)
    atomic_write_json(p, {"v": 2})
    assert mode_of(p) == 0o600 and '"v": 2' in p.read_text()
    os.chmod(p, 0o664)
    atomic_write_json(p, {"v": 3})
    assert mode_of(p) == 0o664


def test_explicit_mode_wins(tmp_path, umask):
    umask(0o077)
    atomic_write(tmp_path / "x", lambda f: f.write(b"x"), mode=0o640)
    assert mode_of(tmp_path / "x") == 0o640


@pytest.mark.slow
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_train_outputs_follow_the_umask(tmp_path, mask):
    """metrics JSON, tune log, tuning cache and checkpoint of one `mgg.train` run."""
    env = dict(os.environ, OMPI_MCA_osc="^ucx", CI="true", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = {"metrics": tmp_path / "m.json", "log": tmp_path / "tune.json", "cache": tmp_path / "cache.json"}
    # 150 epochs on a small sbm: enough for the tuner to finish its search and write the cache
    r = subprocess.run([sys.executable, "-m", "mgg.train", "--dataset", "sbm", "--scale", "0.02",
                        "--eval-every", "1000", "--backend", "cpu", "--epochs", "150", "--tune",
                        "--tune-cache", str(out["cache"]), "--tune-log", str(out["log"]),
                        "--metrics-json", str(out["metrics"]), "--checkpoint-dir", str(tmp_path / "ck")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: os.umask(mask))
    assert r.returncode == 0, r.stderr
    files = list(out.values()) + [tmp_path / "ck" / "checkpoint.mgg"]
    for p in files:
        assert p.exists(), p
        assert mode_of(p) == 0o666 & ~mask, (p, oct(mode_of(p)))


# -- temporary files of interrupted writes ----------------------------------------------------------
CRASH_MID_WRITE = """
import os, sys
from mgg.atomic import atomic_write
def write(f):
    f.write(b"partial")
    f.flush()
    os._exit(9)  # dies mid-write, as on SIGKILL or a preempted node
atomic_write(sys.argv[1], write)
"""

HOLD_MID_WRITE = """
import sys
from mgg.atomic import atomic_write
def write(f):
    f.write(b"first half,")
    f.flush()
    print("writing", flush=True)
    sys.stdin.readline()  # the parent looks for stale files now
    f.write(b"second half")
atomic_write(sys.argv[1], write)
"""


def _python(code, *args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, **kw)


def temporaries(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith(".tmp-"))


def test_a_crashed_writers_temporary_is_removed_and_nothing_else(tmp_path):
    target = tmp_path / "checkpoint.mgg"
    for _ in range(2):
        assert _python(CRASH_MID_WRITE, str(target)).wait(timeout=120) == 9
    left = temporaries(tmp_path)
    assert len(left) == 2 and all(n.endswith("-checkpoint.mgg") for n in left)
    (tmp_path / ".tmp-abcd1234-checkpoint.mgg").write_bytes(b"x")  # one a writer without locks left
    keep = [".tmp-abcd1234-other.json", "checkpoint.mgg.bak", ".tmp-checkpoint.mgg"]
    for name in keep:
        (tmp_path / name).write_bytes(b"keep")
    (tmp_path / ".tmp-link-checkpoint.mgg").symlink_to(tmp_path / "checkpoint.mgg.bak")
    removed = remove_stale_temporaries(target)
    assert sorted(os.path.basename(p) for p in removed) == sorted(left + [".tmp-abcd1234-checkpoint.mgg"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + [".tmp-link-checkpoint.mgg"])


def test_a_live_writers_temporary_is_kept(tmp_path):
    """Another process in the middle of its write: its temporary file survives a cleaner, and its
    write completes."""
    target = tmp_path / "checkpoint.mgg"
    p = _python(HOLD_MID_WRITE, str(target), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "writing\n"
        assert len(temporaries(tmp_path)) == 1
        assert remove_stale_temporaries(target) == []
        assert len(temporaries(tmp_path)) == 1
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.wait(timeout=120) == 0
    finally:
        if p.poll() is None:
            p.kill()
    assert target.read_bytes() == b"first half,second half" and temporaries(tmp_path) == []


def test_own_temporary_survives_a_cleaner_in_the_same_process(tmp_path):
    target = tmp_path / "checkpoint.mgg"

    def write(f):
        f.write(b"data")
        assert remove_stale_temporaries(target) == []
    atomic_write(target, write)
    assert target.read_bytes() == b"data" and temporaries(tmp_path) == []


def test_a_temporary_removed_before_its_writer_locks_it_is_made_again(tmp_path, monkeypatch):
    """The window between creating the temporary file and locking it: a cleaner that removes it
    then makes the writer start on a new one, and the write still lands."""
    import tempfile

    import mgg.atomic as atomic

    made = []
    real = tempfile.mkstemp

    def mkstemp_then_cleaner(*a, **kw):
        fd, path = real(*a, **kw)
        made.append(path)
        if len(made) == 1:
            assert remove_stale_temporaries(tmp_path / "checkpoint.mgg") == [path]
        return fd, path

    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp_then_cleaner)
    atomic_write(tmp_path / "checkpoint.mgg", lambda f: f.write(b"data"))
    assert len(made) == 2 and (tmp_path / "checkpoint.mgg").read_bytes() == b"data"
    assert temporaries(tmp_path) == []
