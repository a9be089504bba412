"""mgg/atomic.py: atomic writes give the mode `open(path, "w")` would."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mgg.atomic import atomic_path, atomic_write, atomic_write_json, current_umask

ROOT = Path(__file__).resolve().parents[1]


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
