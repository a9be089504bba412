"""Tuning cache (round trip, atomic writes, corrupt files), second-run-from-cache, the tuning
log and `python -m mgg.tune --report`."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from mgg import tune as tune_cli
from mgg.tuning import (AggregationTuner, DeviceLimits, SearchSpace, TuneConfig, TuneKey,
                        TuningCache, atomic_write_json, kernel_version, read_log)
from mgg.tuning import cache as cache_mod

from mgg.testing.processes import PROCESS_TIMEOUT_S

from mgg.testing.tuning import GPU, Applied, convex, drive

KEY = TuneKey("abc123", 4, 602, "test-gpu", "0.1.0+k")


def test_cache_round_trip_and_keys(tmp_path):
    c = TuningCache(tmp_path / "tc.json")
    assert c.lookup(KEY) is None  # no file
    best = TuneConfig(8, 4, 2, "ptr")
    c.store(KEY, best, 1.25, 17)
    other = TuneKey("abc123", 8, 602, "test-gpu", "0.1.0+k")  # another world size
    c.store(other, TuneConfig(4, 2, 1), 2.0, 9)
    e = TuningCache(tmp_path / "tc.json").lookup(KEY)
    assert e.best == best and e.latency_ms == 1.25 and e.trials == 17 and e.key == KEY
    assert TuningCache(tmp_path / "tc.json").lookup(other).best == TuneConfig(4, 2, 1)
    for changed in (TuneKey("abc123", 4, 128, "test-gpu", "0.1.0+k"),
                    TuneKey("abc123", 4, 602, "H100", "0.1.0+k"),
                    TuneKey("abc123", 4, 602, "test-gpu", "0.2.0+k"),
                    TuneKey("zzz", 4, 602, "test-gpu", "0.1.0+k")):
        assert c.lookup(changed) is None
    assert len(c.entries()) == 2
    assert json.load(open(tmp_path / "tc.json"))["format"] == "mgg-tuning-cache"


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "tc.json"
    TuningCache(path).store(KEY, TuneConfig(2, 2, 2), 1.0, 3)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(cache_mod.json, "dump", boom)
    with pytest.raises(OSError, match="disk full"):
        TuningCache(path).store(KEY, TuneConfig(4, 4, 4), 0.5, 3)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["tc.json"]  # no temp file left behind
    monkeypatch.undo()
    atomic_write_json(tmp_path / "sub" / "x.json", {"a": 1})
    assert json.load(open(tmp_path / "sub" / "x.json")) == {"a": 1}


@pytest.mark.parametrize("content", ["{not json", '{"format": "something else"}', "[1, 2]",
                                     '{"format": "mgg-tuning-cache", "version": 1, "entries": {"k": {"best": 3}}}'])
def test_corrupt_cache_is_set_aside_not_clobbered(tmp_path, caplog, content):
    path = tmp_path / "tc.json"
    path.write_text(content)
    c = TuningCache(path)
    with caplog.at_level(logging.WARNING, logger="mgg.tuner"):
        assert c.lookup(KEY) is None
    assert "unreadable" in caplog.text
    assert (tmp_path / "tc.json.corrupt").read_text() == content
    assert not path.exists()
    c.store(KEY, TuneConfig(2, 1, 1), 1.0, 1)  # a fresh cache next to the kept one
    assert TuningCache(path).lookup(KEY).best == TuneConfig(2, 1, 1)
    path.write_text("garbage again")
    assert TuningCache(path).lookup(KEY) is None
    assert (tmp_path / "tc.json.corrupt.1").read_text() == "garbage again"


def test_second_run_uses_zero_search_iterations(tmp_path):
    kw = dict(cache_path=tmp_path / "tc.json", key=KEY, log_path=tmp_path / "log.json")
    ap1 = Applied()
    t1 = AggregationTuner(ap1, 602, GPU, **kw)
    drive(t1, ap1, convex, 120)
    assert t1.done and t1.search_iterations > 5
    ap2 = Applied()
    t2 = AggregationTuner(ap2, 602, GPU, **kw)
    assert t2.from_cache and t2.done and t2.search_iterations == 0
    assert ap2.calls == [t1.best]  # applied once, before the first iteration
    drive(t2, ap2, convex, 5)
    assert ap2.calls == [t1.best] and len(t2.steady) == 5
    # the state of a cache-started run resumes as a cache start
    ap3 = Applied()
    t3 = AggregationTuner(ap3, 602, GPU, enabled=True)
    t3.load_state_dict(t2.state_dict())
    assert t3.from_cache and ap3.current == t1.best


def test_cached_config_that_does_not_fit_is_retuned(tmp_path, caplog):
    TuningCache(tmp_path / "tc.json").store(KEY, TuneConfig(32, 4, 16), 1.0, 10)
    small = DeviceLimits(8, 16384, 65536, 1024, 2048, "small")
    ap = Applied()
    with caplog.at_level(logging.WARNING, logger="mgg.tuner"):
        t = AggregationTuner(ap, 602, small, cache_path=tmp_path / "tc.json", key=KEY)
    assert not t.from_cache and "does not fit" in caplog.text
    assert ap.current == TuneConfig(1, 1, 1)


def _tuning_log(tmp_path, variants=("pipelined", "ptr"), grid=False) -> str:
    ap = Applied()
    log = tmp_path / "log.json"
    t = AggregationTuner(ap, 128, GPU, variants=variants, log_path=log,
                         cache_path=tmp_path / "tc.json", key=TuneKey("g", 2, 128, GPU.name, kernel_version()))

    def f(c):
        return convex(c) * (0.9 if c.variant == "ptr" else 1.0)

    drive(t, ap, f, 100)
    if grid:
        d = json.load(open(log))
        d["grid"] = [{**c.to_dict(), "latency_ms": f(c)} for v in variants for c in SearchSpace().grid(v)]
        atomic_write_json(log, d)
    return str(log)


def test_log_contents(tmp_path):
    log = read_log(_tuning_log(tmp_path))
    assert log["trials"][0]["phase"] == "ps" and log["trials"][0]["ps"] == 1
    assert [r["step"] for r in log["trials"]] == list(range(len(log["trials"])))
    assert log["best"]["variant"] == "ptr" and log["limits"]["name"] == "test-gpu"
    assert log["key"]["world_size"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "mgg-tuning-log", "trials": [{"ps": 1}]}')
    with pytest.raises(ValueError, match="malformed"):
        read_log(bad)


def test_report_cli_table_and_png(tmp_path, capsys):
    path = _tuning_log(tmp_path, grid=True)
    png = tmp_path / "fig.png"
    assert tune_cli.main(["--report", path, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "step  phase" in out and "variant" in out and "grid sweep: 300 configurations" in out
    assert "x the optimum" in out and " *" in out
    lines = [ln for ln in out.splitlines() if ln[:4].strip().isdigit()]
    assert len(lines) == len(read_log(path)["trials"])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
        return
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_report_cli_without_matplotlib_and_errors(tmp_path, capsys, monkeypatch):
    path = _tuning_log(tmp_path)
    monkeypatch.setattr(tune_cli, "_have_matplotlib", lambda: False)
    assert tune_cli.main(["--report", path]) == 0
    assert "plot skipped: matplotlib is not installed" in capsys.readouterr().out
    (tmp_path / "junk.json").write_text("{")
    assert tune_cli.main(["--report", str(tmp_path / "junk.json")]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert tune_cli.main(["--cache", str(tmp_path / "tc.json")]) == 0
    assert "1 entries" in capsys.readouterr().out


@pytest.mark.slow
def test_report_cli_subprocess(tmp_path):
    path = _tuning_log(tmp_path)
    r = subprocess.run([sys.executable, "-m", "mgg.tune", "--report", path, "--no-plot"],
                       capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "measurements" in r.stdout and "best:" in r.stdout


def test_kernel_version_digests_the_cuda_sources(tmp_path, monkeypatch):
    """kernel_version reads mgg/kernels/*.cu and *.cuh: the digest is that of those files (hashed
    here independently) and differs from the digest of no sources at all."""
    import glob
    import hashlib

    import mgg.kernels

    kdir = os.path.dirname(os.path.abspath(mgg.kernels.__file__))
    sources = sorted(glob.glob(os.path.join(kdir, "*.cu")) + glob.glob(os.path.join(kdir, "*.cuh")))
    assert sources, f"no CUDA sources under {kdir}"
    h, empty = hashlib.blake2b(digest_size=6), hashlib.blake2b(digest_size=6)
    for p in sources:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as fh:
            h.update(fh.read())
    digest = kernel_version().rpartition("+")[2]
    assert digest == h.hexdigest()
    assert digest != empty.hexdigest()
