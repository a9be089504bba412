"""bench/run.sh (the one benchmark runner) on the CPU: --dry-run lists every suite's stages without
running them; bench/manifest.py names run folders and writes/finishes manifests."""
import json
import os
import platform
import subprocess
import sys

import pytest

from bench import manifest
from mgg.testing.paths import ROOT
from mgg.testing.processes import subprocess_env

SUITES = {
    "gpu-tests": ["build", "nvrtc-probe", "gpu-tests"],
    "fullgraph": ["fullgraph"],
    "sampled": ["sampled-vs-pyg", "sampled-prefetch", "sampled-reorder", "sampled-accuracy", "pyg-neighborloader"],
    "gat": ["gat-threshold", "gat"],
    "tuner": ["tune-grid", "tune-saved-grid", "train-tune"],
    "embedding": ["embedding-lookup", "embedding-serve", "dlrm"],
    "e2e": ["e2e", "e2e-papers"],
    "one-gpu": ["one-gpu-epochs", "one-gpu-kernels", "one-gpu-gat"],
    "scaling": ["scaling-cli", "scaling", "overlap"],
}


def dry(*args, **env):
    e = {**os.environ, "NGPU": "2", **env}
    return subprocess.run(["bash", str(ROOT / "bench" / "run.sh"), "--dry-run", *args], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=60)


def stages_of(out: str) -> list[str]:
    return [ln[3:] for ln in out.splitlines() if ln.startswith("== ")]


def test_dry_run_all_lists_every_stage_once_in_suite_order(tmp_path):
    r = dry("all", OUT=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert stages_of(r.stdout) == [s for suite in SUITES.values() for s in suite]
    assert "mpirun" in r.stdout and "-np 2" in r.stdout and "NVSHMEM_DISABLE_NVLS" in r.stdout
    assert "bench/fullgraph.py --summarize" in r.stdout
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_without_a_gpu_a_run_is_refused_up_front(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    e = {k: v for k, v in os.environ.items() if k != "NGPU"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "run.sh"), "gpu-tests"], cwd=ROOT, env={**e, "OUT": str(tmp_path)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA GPU visible" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "" and not list(tmp_path.iterdir())  # nothing built, no results folder


def test_dry_run_one_suite_and_one_gpu():
    r = dry("tuner", "gat", NGPU="1")
    assert r.returncode == 0, r.stderr
    assert stages_of(r.stdout) == SUITES["tuner"] + SUITES["gat"]
    assert "mpirun" not in r.stdout  # P = 1 only: no launcher


def test_runner_environment_keeps_nvls_off():
    text = (ROOT / "bench" / "device_env.sh").read_text()
    assert "NVSHMEM_DISABLE_NVLS=1" in text and "NCCL_NVLS_ENABLE=0" in text


@pytest.mark.parametrize("args,msg", [(["nope"], "unknown suite 'nope'"), (["--fast", "gat"], "unknown option --fast"),
                                      ([], "Suites")])
def test_bad_arguments(args, msg):
    r = dry(*args)
    assert r.returncode == 2 and msg in r.stderr


def test_run_dir_name_and_gpu_slug():
    assert manifest.gpu_slug(["NVIDIA H200", "NVIDIA H200"]) == "h200x2"
    assert manifest.gpu_slug(["NVIDIA H100 80GB HBM3"]) == "h100x1"
    assert manifest.gpu_slug([]) == "cpu"
    assert manifest.run_dir_name("2026-11-23", ["NVIDIA H200"] * 2, "b618618") == "2026-11-23-h200x2-b618618"
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        manifest.run_dir_name("20261123", [], "abc")


def test_collect_manifest_on_cpu():
    doc = manifest.collect("bench/run.sh gat", ["gat"], gpus=[], commit="abc1234")
    assert doc["command"] == "bench/run.sh gat" and doc["suites"] == ["gat"] and doc["commit"] == "abc1234"
    assert doc["gpus"] == [] and doc["gpu_count"] == 0 and doc["ended"] is None and doc["reconstructed"] == []
    v = doc["versions"]
    assert v["python"] == platform.python_version()
    import numpy
    import torch
    assert v["torch"] == torch.__version__ and v["numpy"] == numpy.__version__
    assert set(v) >= {"python", "torch", "cupy", "nvshmem"}
    json.dumps(doc)  # serialisable


def test_begin_and_end_write_the_folder(tmp_path):
    """The CLI the runner calls: begin makes <date>-<gpu>x<n>-<commit> (suffix when taken), end records stages."""
    def begin():
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "manifest.py"), "begin", str(tmp_path), "--suites",
                            "gat", "--command", "bench/run.sh gat"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()
    first, second = begin(), begin()
    doc = json.loads(open(os.path.join(first, "manifest.json")).read())
    assert os.path.basename(first) == manifest.run_dir_name(doc["started"][:10], doc["gpus"], doc["commit"])
    assert second == first + "-2"
    with open(os.path.join(first, "stages.tsv"), "w") as f:
        f.write("gat-threshold\t0\t12\ngat\t1\t130\n")
    subprocess.run([sys.executable, str(ROOT / "bench" / "manifest.py"), "end", first], check=True, timeout=60)
    done = json.loads(open(os.path.join(first, "manifest.json")).read())
    assert done["stages"] == [{"name": "gat-threshold", "rc": 0, "seconds": 12}, {"name": "gat", "rc": 1, "seconds": 130}]
    assert done["ended"] >= done["started"] and done["command"] == "bench/run.sh gat"


def test_scaling_runs_p1_beside_p2_when_a_third_gpu_is_free():
    r = dry("scaling", NGPU="4")
    assert r.returncode == 0, r.stderr
    cli = [ln for ln in r.stdout.splitlines() if "bench/scaling.py --cli" in ln]
    assert len(cli) == 1 and "mpirun" not in cli[0]  # it launches mpirun itself, for each P
    lines = [ln for ln in r.stdout.splitlines() if "bench/fullgraph.py" in ln]
    assert len(lines) == 3  # P = 1, 2, 4
    assert "env CUDA_VISIBLE_DEVICES=3 python3" in lines[0] and "mpirun" not in lines[0]
    assert "-np 2 env CUDA_VISIBLE_DEVICES=0\\,1 python3" in lines[1]
    assert "-np 4 python3" in lines[2]
    seq = dry("scaling", NGPU="4", SCALING_SEQUENTIAL="1")
    assert "CUDA_VISIBLE_DEVICES" not in seq.stdout and seq.stdout.count("bench/fullgraph.py --out") == 3
    two = dry("scaling", NGPU="2")
    assert "CUDA_VISIBLE_DEVICES" not in two.stdout  # no third GPU: one after the other


def test_gpu_tests_keep_each_failure_as_it_happens():
    """The gpu-tests stage points MGG_TEST_FAILURE_LOG at one file per P in the run folder and
    turns MGG_TEST_ABORT_ON_FAILURE on (a multi-rank failure ends the run instead of hanging it)."""
    r = dry("gpu-tests")
    assert r.returncode == 0, r.stderr
    assert "MGG_TEST_FAILURE_LOG=\\<run-dir\\>/gpu-tests-P1.failures" in r.stdout
    assert ("-np 2 env MGG_TEST_FAILURE_LOG=\\<run-dir\\>/gpu-tests-P2.failures MGG_TEST_ABORT_ON_FAILURE=1 "
            "python3 -m pytest") in r.stdout


@pytest.mark.slow
def test_failure_log_is_written_per_rank_at_once(tmp_path):
    """The suite's failure log (tests/conftest.py, mgg.testing.failure_log): a failing test's report
    lands in MGG_TEST_FAILURE_LOG (.rankR under mpirun) before the session ends; passing tests
    write nothing."""
    (tmp_path / "conftest.py").write_text("from mgg.testing.failure_log import log_failed_report as "
                                          "pytest_runtest_logreport  # noqa: F401\n")
    (tmp_path / "test_x.py").write_text("def test_ok():\n    pass\n\n"
                                        "def test_bad():\n    assert 1 == 2, 'the message'\n")
    log = tmp_path / "fail.log"
    for rank, name in ((None, "fail.log"), ("3", "fail.log.rank3")):
        env = subprocess_env(MGG_TEST_FAILURE_LOG=str(log))  # mgg importable from the repository
        for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MGG_TEST_ABORT_ON_FAILURE"):
            env.pop(k, None)
        if rank is not None:
            env["OMPI_COMM_WORLD_RANK"] = rank
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        text = (tmp_path / name).read_text()
        assert text.startswith("=== FAILED test_x.py::test_bad (call,") and "the message" in text
        assert "test_ok" not in text
