"""The kernel module registry, the kernels a run's configuration needs, their parallel prebuild
and `python -m mgg.build`.

The builds here are small (two plain modules) or reuse the run's one kernel cache (conftest's
`kernel_cache_dir`, which tests/kernels/test_kernel_build.py fills with every source), so nvcc runs once
per module per test run."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mgg.apps.config import TrainConfig, UserError
from mgg.apps.kernel_prebuild import (aggregation_variants, finish_kernel_prebuild, kernel_features,
                                      run_kernel_modules)
from mgg.kernels.modules import FEATURES, kernel_module, module_names, modules_for
from mgg.testing.paths import ROOT
from mgg.testing.processes import subprocess_env

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA 13)")
SOURCES = sorted(os.path.basename(p)[:-3] for p in glob.glob(str(ROOT / "mgg" / "kernels" / "*.cu")))


def test_every_source_is_registered_with_its_nvshmem_flag():
    assert set(module_names()) == set(SOURCES)
    for name in SOURCES:
        text = (ROOT / "mgg" / "kernels" / f"{name}.cu").read_text()
        assert kernel_module(name).nvshmem == ("#include <nvshmem" in text), name
    assert set(module_names(training_only=True)) == set(SOURCES) - {"embedding_bag"}
    every = set()
    for f in FEATURES:
        every |= set(modules_for([f]))
    assert every == set(SOURCES)  # each module is reachable from some feature


def test_load_module_refuses_an_unregistered_or_misflagged_module():
    from mgg.kernels.build import load_module

    with pytest.raises(ValueError, match="register mgg/kernels/nosuch.cu"):
        load_module("nosuch")
    with pytest.raises(ValueError, match="nvshmem=False"):
        load_module("local_csr", nvshmem=True)
    with pytest.raises(ValueError, match="unknown kernel features"):
        modules_for(["dense", "warp_drive"])


def test_features_of_the_default_runs():
    gcn1 = set(run_kernel_modules(TrainConfig(model="gcn"), 1))
    assert gcn1 == {"local_csr:fp32", "local_csr:fp32.w1", "local_csr:fp32.w2", "local_csr:fp32.l32",
                    "local_csr:fp32.w1.l32", "local_csr:fp32.w2.l32", "relu_grad", "bias_relu_dropout",
                    "dropout", "dropout_project"}
    gcn4 = set(run_kernel_modules(TrainConfig(model="gcn"), 4))
    assert gcn4 == gcn1 | {"aggregate"}  # other GPUs' rows, and the halo / ptr variants
    bf16 = set(run_kernel_modules(TrainConfig(model="gcn", storage_dtype="bf16"), 2))
    assert {"local_csr:fp32", "local_csr:bf16.w2", "local_csr:bf16.w2.l32"} <= bf16
    assert not {"local_csr:fp16", "local_csr:fp16.l32"} & bf16
    assert "norm_relu" in run_kernel_modules(TrainConfig(model="gin"), 2)  # GIN's default batch norm
    assert "norm_relu" not in run_kernel_modules(TrainConfig(model="gin", norm="layer"), 2)
    gat = set(run_kernel_modules(TrainConfig(model="gat"), 1))
    assert "gat_fused" in gat and "local_csr:fp32" not in gat
    assert "dropout" not in run_kernel_modules(TrainConfig(model="gcn", dropout=0.0), 1)
    sampled = kernel_features(TrainConfig(model="sage", mode="sampled"), 2)
    # sampled mode evaluates through its full-graph twin: the full-graph aggregation kernels too
    assert {"sampling", "csr_variants", "halo_gather"} <= set(sampled)
    # the batches' feature rows come through the store's gather kernel (aggregate), also at P = 1
    assert {"local_csr:fp32", "sample", "aggregate"} <= set(run_kernel_modules(TrainConfig(model="sage", mode="sampled"), 1))
    assert "plan_variants" in kernel_features(TrainConfig(model="gcn", tune=True), 1)
    assert kernel_features(TrainConfig(model="gcn", variant="csr_rows"), 1) == ("csr_variants", "dense", "dropout")
    assert "tall_rows" in sampled  # a sampled batch's input layer can be tall


def test_the_graph_size_adds_the_tall_gemm_kernels():
    """Known after the load: a rank of TALL_GEMM_ROWS rows or more runs the tall-matrix GEMMs."""
    import numpy as np

    from mgg.apps.kernel_prebuild import max_rank_rows, size_specs
    from mgg.nn.dense import TALL_GEMM_ROWS

    cfg = TrainConfig(model="gcn")
    known = run_kernel_modules(cfg, 1)
    tall = np.zeros(TALL_GEMM_ROWS + 1, dtype=np.int64)  # an edgeless graph: split by node counts
    assert max_rank_rows(tall, 1) == TALL_GEMM_ROWS
    assert size_specs(cfg, 1, tall, known) == [f"tall_gemm:{p}" for p in ("k1", "k2", "k3", "k4", "tn", "k3p2", "k4p2",
                                                                          "k4n8")]
    assert size_specs(cfg, 2, tall, run_kernel_modules(cfg, 2)) == []  # half the rows a rank
    from mgg.apps.kernel_prebuild import preset_rows_per_rank

    assert preset_rows_per_rank(TrainConfig(dataset="products-like"), 4) >= TALL_GEMM_ROWS  # 2.4M nodes
    assert preset_rows_per_rank(TrainConfig(dataset="reddit-like", scale=0.1), 1) < TALL_GEMM_ROWS
    assert preset_rows_per_rank(TrainConfig(dataset="karate"), 1) is None
    assert size_specs(TrainConfig(model="sage", mode="sampled"), 1, tall,
                      run_kernel_modules(TrainConfig(model="sage", mode="sampled"), 1)) == []
    assert "plan_variants" in kernel_features(TrainConfig(model="gcn", variant="paper"), 1)


@pytest.mark.parametrize("storage", ["fp32", "bf16", "fp16"])
def test_auto_variants_cover_what_choose_variant_picks(storage):
    """Whatever `--variant auto` resolves to on a plan is among aggregation_variants (so its kernels
    are prebuilt): no remote work, remote rows that repeat, remote rows that do not."""
    from mgg.kernels.gpu import choose_variant

    for world, remote, halo in ((1, 0, 0), (2, 0, 0), (2, 100, 10), (2, 100, 90), (4, 5, 5)):
        plan = SimpleNamespace(num_remote_edges=remote, halo_size=halo)
        picked = choose_variant(plan, storage)
        assert picked in aggregation_variants(TrainConfig(storage_dtype=storage), world), (world, remote, halo)


def test_parts_and_specs():
    from mgg.kernels.modules import expand_specs, parse_spec

    csr = kernel_module("local_csr")
    assert len(csr.parts) == 18 and csr.part_names[:4] == ("fp32", "fp32.l32", "fp32.w1", "fp32.w1.l32")
    assert csr.part_of("mgg_csr_rows_l32_v4_w1") == "fp32.w1.l32" and csr.part_of("mgg_csr_scale_rows") == "fp32"
    assert csr.part_of("mgg_csr_rows_l16_v1_w1") == "fp32.w1" and csr.part_of("mgg_csr_rows_bf16_l32_v2_w0") == "bf16.l32"
    assert csr.part_of("mgg_csr_rows_bf16_l1_v1_w0") == "bf16" and csr.part_of("mgg_csr_combine_fp16") == "fp16"
    assert csr.part_of("mgg_csr_table16_bf16") == "bf16" and csr.part_of("mgg_csr_scan_fp16_l4_w1") == "fp16.w1"
    assert csr.part_defines("bf16.w2") == ("MGG_CSR_STORAGE=1", "MGG_CSR_W=2", "MGG_CSR_L32=0")
    assert csr.part_defines("bf16.w2.l32") == ("MGG_CSR_STORAGE=1", "MGG_CSR_W=2", "MGG_CSR_L32=1")
    fp32 = ("fp32", "fp32.l32", "fp32.w1", "fp32.w1.l32", "fp32.w2", "fp32.w2.l32")
    assert csr.parts_for_storage("fp32") == fp32
    assert csr.parts_for_storage("fp16") == fp32 + tuple(p.replace("fp32", "fp16") for p in fp32)
    assert parse_spec("local_csr:fp16") == ("local_csr", "fp16") and parse_spec("aggregate") == ("aggregate", None)
    assert expand_specs(["local_csr", "local_csr:fp32", "dropout"]) == [
        *(("local_csr", p) for p in csr.part_names), ("dropout", None)]
    with pytest.raises(ValueError, match="has no part 'int8'"):
        parse_spec("local_csr:int8")
    with pytest.raises(ValueError, match="built whole"):
        kernel_module("aggregate").part_of("mgg_local_v1")
    tg = kernel_module("tall_gemm")
    assert tg.part_of("mgg_tall_gemm_xbp_k2_n6") == "k2" and tg.part_of("mgg_tall_gemm_xb_k4_n8_p2") == "k4p2"
    assert tg.part_of("mgg_tall_gemm_tnpm_k8") == "tn" and tg.parts_for_storage("bf16") == tg.part_names
    assert tg.part_of("mgg_tall_gemm_xbs_k4_n8") == "k4n8" and tg.part_of("mgg_tall_gemm_xbp_k4_n6") == "k4"
    assert tg.part_of("mgg_tall_gemm_xb_k4_n8_p2") == "k4p2" and tg.part_of("mgg_tall_gemm_xb_k3_n8") == "k3"


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("name", [n for n in module_names() if kernel_module(n).parts])
def test_the_parts_split_the_entry_points_where_part_of_looks(name):
    """Preprocessed with each part's macros, the source declares disjoint sets of entry points
    whose union is the whole source's, and each entry point sits in the part `part_of` names."""
    import re

    def entries(defines=()):
        out = subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-std=c++17", "-E", "-x", "cu",
                              *[f"-D{d}" for d in defines], str(ROOT / "mgg" / "kernels" / f"{name}.cu")],
                             capture_output=True, text=True, check=True).stdout
        return set(re.findall(r'extern "C"[^;{]*?\b(mgg_\w+)\s*\(', out))

    module = kernel_module(name)
    whole = entries()
    parts = {p.name: entries(p.defines) for p in module.parts}
    assert len(whole) > 50 and all(parts.values())
    assert set().union(*parts.values()) == whole and sum(map(len, parts.values())) == len(whole)
    for part, names in parts.items():
        assert {module.part_of(n) for n in names} == {part}


def test_a_failed_prebuild_is_one_user_error(monkeypatch, tmp_path):
    """nvcc missing: the build phase raises one line naming the problem and the log of the
    compiler's output (here: none), not a traceback of the build thread."""
    from mgg.apps import kernel_prebuild
    from mgg.kernels import build
    from mgg.kernels.prebuild import KernelPrebuild
    from mgg.runtime import world

    monkeypatch.setenv("MGG_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "nvcc_path", lambda: None)
    comm = world(use_mpi=False)
    kernel_prebuild._ACTIVE[id(comm)] = [KernelPrebuild(["relu_grad"], ["sm_90"]).start()]
    with pytest.raises(UserError) as e:
        finish_kernel_prebuild(comm)
    msg = str(e.value)
    assert "\n" not in msg and "relu_grad.cu (sm_90)" in msg and "nvcc is not on PATH" in msg
    assert str(tmp_path / "build-errors.log") in msg
    finish_kernel_prebuild(comm)  # nothing pending: nothing raised


def test_a_compile_error_is_reported_by_its_first_error_line():
    from mgg.kernels.prebuild import _first_error

    text = ("building local_csr.cu for sm_90 failed:\n"
            "_build_plain: RuntimeError: /usr/local/bin/nvcc -arch=sm_90 -cubin -O3 local_csr.cu -o k.cubin\n"
            "mgg/kernels/local_csr.cu(12): error: identifier \"foo\" is undefined\n1 error detected\n")
    assert _first_error(text) == 'mgg/kernels/local_csr.cu(12): error: identifier "foo" is undefined'


@pytest.mark.slow
@needs_nvcc
def test_prebuild_builds_in_parallel_with_progress_then_hits_the_cache(monkeypatch, tmp_path):
    from mgg.kernels.build import cubin_target
    from mgg.kernels.prebuild import KernelPrebuild

    monkeypatch.setenv("MGG_KERNEL_CACHE", str(tmp_path))
    lines: list[str] = []
    pre = KernelPrebuild(["relu_grad", "dropout"], ["sm_90"], progress=lines.append).start()
    assert pre.jobs >= 1 and len(pre.missing) == 2
    res = pre.wait()
    assert sorted(res.built) == ["dropout@sm_90", "relu_grad@sm_90"] and not res.cached
    assert lines[0] == "building 2 CUDA kernels for sm_90 ... 0/2"
    assert lines[1:3] == ["building 2 CUDA kernels for sm_90 ... 1/2", "building 2 CUDA kernels for sm_90 ... 2/2"]
    assert lines[3].startswith("built 2 CUDA kernels for sm_90 in ")
    for n in ("relu_grad", "dropout"):
        assert open(cubin_target(n, "sm_90").path, "rb").read(4) == b"\x7fELF"
    lines.clear()
    again = KernelPrebuild(["relu_grad", "dropout"], ["sm_90"], progress=lines.append).start().wait()
    assert lines == [] and sorted(again.cached) == ["dropout@sm_90", "relu_grad@sm_90"] and not again.built


@pytest.mark.slow
@needs_nvcc
def test_a_process_that_exits_mid_build_ends_its_compilers(tmp_path):
    """A run that fails while its kernels build in the background exits without waiting for them
    and leaves no compiler running (the builder threads are daemons; nvcc's process group is
    killed at exit)."""
    import signal
    import time

    probe = ("import time\nfrom mgg.kernels import build\nfrom mgg.kernels.prebuild import KernelPrebuild\n"
             "KernelPrebuild(['tall_gemm'], ['sm_90']).start()\n"
             "while not build._RUNNING: time.sleep(0.05)\n"
             "print(next(iter(build._RUNNING)).pid, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", probe], env=subprocess_env(MGG_KERNEL_CACHE=str(tmp_path)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    group = int(r.stdout.split()[-1])
    for _ in range(600):  # killed at exit; the kernel reaps the group at once, on a loaded box a moment later
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(group, signal.SIGKILL)
        pytest.fail("the compiler outlived the process that started it")
    assert not list(tmp_path.glob("*.cubin"))


def test_mgg_build_refuses_bad_arguments(capsys):
    from mgg.build import main

    import torch

    if not torch.cuda.is_available():
        assert main([]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--arch" in err
    with pytest.raises(SystemExit):
        main(["--arch", "hopper"])
    assert main(["--arch", "sm_90", "--jobs", "0"]) == 2


@pytest.mark.slow
@needs_nvcc
def test_mgg_build_prebuilds_every_training_kernel_without_a_gpu(kernel_cache_dir):
    """`python -m mgg.build --arch sm_90` on a machine without a GPU fills the cache with every
    module training loads (the suite's cache: sources tests/kernels/test_kernel_build.py built are hits),
    and `--list` then shows each one cached."""
    pytest.importorskip("nvidia.nvshmem", reason="needs the nvidia-nvshmem-cu13 wheel (the test extra)")
    env = subprocess_env(MGG_KERNEL_CACHE=str(kernel_cache_dir))
    r = subprocess.run([sys.executable, "-m", "mgg.build", "--arch", "sm_90"], env=env, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stderr
    from mgg.kernels.modules import expand_specs

    n = len(expand_specs(module_names(training_only=True)))  # local_csr's parts count apart
    assert f"{n} CUDA kernels for sm_90 in {kernel_cache_dir}" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mgg.build", "--arch", "sm_90", "--list"], env=env,
                       capture_output=True, text=True, timeout=300)
    rows = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(rows) == n and all(" cached " in row for row in rows), r.stdout


def test_the_longest_builds_start_first(monkeypatch, tmp_path):
    """The prebuild queues its missing cubins by registered compile seconds, longest first: a
    P = 4 GCN run starts aggregate.cu and local_csr's 32-lane parts before the short modules."""
    from mgg.kernels.prebuild import KernelPrebuild

    monkeypatch.setenv("MGG_KERNEL_CACHE", str(tmp_path))
    pre = KernelPrebuild(run_kernel_modules(TrainConfig(model="gcn"), 4), ["sm_90"])
    secs = [kernel_module(t.name).build_seconds(t.part) for t in pre.missing]
    assert secs == sorted(secs, reverse=True) and len(secs) == len(pre.targets) == 11
    assert (pre.missing[0].name, pre.missing[1].part) == ("aggregate", "fp32.l32")
    assert pre.missing[-1].name in ("relu_grad", "bias_relu_dropout", "dropout")


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_bound_process_builds_on_every_cpu(tmp_path):
    """A rank bound to one CPU (mpirun --bind-to core) runs its compilers on every CPU, and counts
    them all as parallel jobs; its own thread stays bound."""
    probe = ("import os, time\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
             "from mgg.kernels import build\nfrom mgg.kernels.prebuild import KernelPrebuild, build_cpus\n"
             "pre = KernelPrebuild(['tall_gemm:tn'], ['sm_90']).start()\n"
             "while not build._RUNNING: time.sleep(0.001)\n"
             "pid = next(iter(build._RUNNING)).pid\n"
             "print(len(os.sched_getaffinity(pid)), build_cpus(), len(os.sched_getaffinity(0)), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", probe], env=subprocess_env(MGG_KERNEL_CACHE=str(tmp_path)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    child, jobs, main = map(int, r.stdout.split())
    assert child == jobs == len(os.sched_getaffinity(0)) and main == 1
