"""`python -m mgg.doctor`: alone and under mpirun on the CPU box, plus the pure parts (topology
parsing, problem analysis) on canned multi-GPU facts."""
import json
import subprocess
import sys

import pytest

from mgg.doctor import analyse, parse_topo, summarize_links

from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env as env


def doctor(*args, np_=None, timeout=PROCESS_TIMEOUT_S):
    cmd = [sys.executable, "-m", "mgg.doctor", *args]
    if np_:
        cmd = [*MPIRUN, "-np", str(np_), *cmd]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


# nvidia-smi topo -m of an 8-GPU NVSwitch box and of a PCIe box (with the terminal underline codes)
TOPO_NV = """\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tNV18\tNV18\tPXB\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tPXB\t0-47\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tSYS\t48-95\t1\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tSYS\t48-95\t1\t\tN/A
NIC0\tPXB\tPXB\tSYS\tSYS\t X

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TOPO_PCIE = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPHB\tSYS\t0-15\t0
GPU1\tPHB\t X \tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \t16-31\t1
"""
TOPO_ONE = "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n"


def test_parse_topo():
    links = parse_topo(TOPO_NV)
    assert len(links) == 6 and set(links.values()) == {"NV18"}  # NIC columns are not GPUs
    assert summarize_links(links) == "NVLink between all 6 GPU pairs (NV18 6)"
    pcie = parse_topo(TOPO_PCIE)
    assert pcie == {(0, 1): "PHB", (0, 2): "SYS", (1, 2): "SYS"}
    assert "no NVLink" in summarize_links(pcie)
    assert summarize_links({(0, 1): "NV4", (0, 2): "SYS", (1, 2): "SYS"}).startswith("mixed: NVLink on 1 of 3")
    assert parse_topo(TOPO_ONE) == {} and parse_topo("") == {}


def facts(rank, host="a", gpus=2, nvshmem=True, env=None, **over):
    f = {"rank": rank, "host": host, "python": "3.11", "mgg": "0.1.0", "torch": "2.13.0", "torch_cuda": "13.0",
         "gpus": ["H100"] * gpus, "links": "NVLink between all 1 GPU pairs (NV18 1)", "links_source": "nvidia-smi",
         "mpi_library": "Open MPI v5.0.11", "mpi_standard": "3.1", "mpi4py": "4.1.2", "launch_size": None,
         "nvshmem": {"importable": nvshmem, "version": "3.4.5" if nvshmem else None, "dist": "nvshmem4py-cu13",
                     "error": None if nvshmem else "ModuleNotFoundError: No module named 'nvshmem'"},
         "env": {"NVSHMEM_DISABLE_NVLS": "1", "NVSHMEM_BOOTSTRAP": "MPI"} if env is None else env, "problems": []}
    f.update(over)
    return f


OK = (True, "window get from rank 1 ok")


def test_analyse_healthy_two_nodes():
    fs = [facts(0), facts(1), facts(2, host="b"), facts(3, host="b")]
    lines, problems, warnings = analyse(fs, [0, 0, 1, 1], [OK] * 4, "gpu", 4)
    text = "\n".join(lines)
    assert problems == [] and warnings == []
    assert "ranks: 4   nodes: 2" in text and "node 1 (b): ranks 2-3; GPUs: 2 x H100" in text
    assert "NVLink" in text and "NVSHMEM: importable (3.4.5" in text


def test_analyse_finds_problems():
    fs = [facts(0, gpus=1, env={}), facts(1, gpus=1, env={}, torch="2.12.0"),
          facts(2, host="b", nvshmem=False, env={}, mpi_library="MPICH 4.2"), facts(3, host="b", launch_size=4)]
    fs[0]["launch_size"] = 8
    _, problems, warnings = analyse(fs, [0, 0, 1, 1], [OK, (False, "MPIException: boom"), OK, OK], "gpu", 4)
    text = "\n".join(problems)
    assert "node 0 (a) runs 2 ranks on 1 GPUs" in text
    assert "different MPI libraries" in text and "different torch versions" in text
    assert "launcher started 8 ranks but MPI sees 4" in text
    assert "MPI RMA window test failed on rank 1: MPIException: boom" in text
    assert "NVSHMEM (nvshmem.core) does not import" in text  # a problem with --backend gpu ...
    _, problems2, warnings2 = analyse(fs, [0, 0, 1, 1], [OK] * 4, "auto", 4)
    assert not any("NVSHMEM" in p for p in problems2)  # ... a warning with auto (CPU fallback)
    assert any("NVSHMEM (nvshmem.core)" in w for w in warnings2)
    assert any("NVSHMEM_DISABLE_NVLS" in w for w in warnings) and any("NVSHMEM_BOOTSTRAP" in w for w in warnings)


def test_analyse_cpu_box():
    fs = [facts(0, gpus=0, nvshmem=False, links=None), facts(1, gpus=0, nvshmem=False)]
    for f in fs:
        f["nvshmem"] = {"importable": False, "version": None, "dist": None, "error": "no GPU"}
    lines, problems, _ = analyse(fs, [0, 0], [OK, OK], "auto", 2)
    assert problems == [] and any("NVSHMEM: not usable here (no GPU); not installed" in ln for ln in lines)
    _, problems, _ = analyse(fs, [0, 0], [OK, OK], "gpu", 2)
    assert problems == ["--backend gpu, but no rank sees a CUDA GPU"]


@pytest.mark.slow
def test_single_process(tmp_path):
    r = doctor("--json", str(tmp_path / "d.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for needle in ("ranks: 1   nodes: 1", "MPI: ", "MPI RMA: ok", "NVSHMEM:", "torch ", "result: usable"):
        assert needle in out, out
    assert "PROBLEM" not in out
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["problems"] == [] and doc["node_of_rank"] == [0]


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_under_mpirun_two_simulated_nodes():
    r = doctor("--ranks-per-node", "1", np_=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ranks: 2   nodes: 2" in r.stdout and "MPI RMA: ok (window get from rank 1 ok)" in r.stdout
    assert r.stdout.count("mgg doctor") == 1  # rank 0 reports, once
    r = doctor("--backend", "gpu", np_=2)
    if "GPUs: none" in r.stdout:
        assert r.returncode != 0 and "PROBLEM:" in r.stdout  # every rank exits 1


@pytest.mark.slow
def test_mpi_test_log_is_text(tmp_path):
    """pytest --with-mpi prints pytest-mpi's MPI banner on every rank: no NUL bytes."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--with-mpi",
                        "tests/base/test_version.py::test_version_matches_pyproject"],
                       cwd=ROOT, env=env(), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stdout.decode(errors="replace")
    assert b"MPI library version:" in r.stdout
    assert b"\x00" not in r.stdout + r.stderr
