"""Every CUDA source in mgg/kernels builds the way the runtime builds it: nvcc, and for sources
that call NVSHMEM, relocatable device code linked against libnvshmem_device.a (the
nvidia-nvshmem-cu13 wheel of the test extra). Runs in CI on the CPU box (nvcc is there), so a
kernel that does not build or link never lands. The run's one kernel cache (conftest): each source once."""
import glob
import os
import shutil

import pytest

from mgg.kernels.build import build_cubin
from mgg.testing.paths import ROOT

SOURCES = sorted(os.path.basename(p)[:-3] for p in glob.glob(str(ROOT / "mgg" / "kernels" / "*.cu")))


def _uses_nvshmem(name: str) -> bool:
    text = (ROOT / "mgg" / "kernels" / f"{name}.cu").read_text()
    return "#include <nvshmem" in text


def test_every_source_is_listed():
    assert {"aggregate", "local_csr", "gat_fused", "embedding_bag", "sample", "dropout"} <= set(SOURCES)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA 13)")
@pytest.mark.parametrize("name", SOURCES)
def test_source_builds_and_links(name, kernel_cache_dir, monkeypatch):
    monkeypatch.setenv("MGG_KERNEL_CACHE", str(kernel_cache_dir))
    nvshmem = _uses_nvshmem(name)
    if nvshmem:
        pytest.importorskip("nvidia.nvshmem", reason="needs the nvidia-nvshmem-cu13 wheel (the test extra)")
    from mgg.kernels.modules import kernel_module
    from mgg.kernels.prebuild import KernelPrebuild

    if kernel_module(name).parts:  # in parallel, as a run builds them
        KernelPrebuild([name], ["sm_90"]).start().wait()
    for part in kernel_module(name).part_names or (None,):  # what the runtime builds: each part apart
        b = build_cubin(name, "sm_90", nvshmem=nvshmem, part=part)
        data = open(b.path, "rb").read()
        assert data[:4] == b"\x7fELF" and len(data) > 1000  # a cubin (an ELF image), linked
        assert b.method == ("nvcc" if nvshmem else "plain")
        assert b".text." in data  # it has kernel code (entry points)


def test_the_cache_key_covers_local_headers(tmp_path):
    """A source's #include "x.cuh" from its directory is part of what the cache key hashes
    (recursively, each header once; an include cycle ends), so editing a shared header rebuilds."""
    from mgg.kernels.build import source_text

    (tmp_path / "a.cu").write_text('#include "h.cuh"\n#include <stdint.h>\nint a;\n')
    (tmp_path / "h.cuh").write_text('#include "g.cuh"\nint h1;\n')
    (tmp_path / "g.cuh").write_text('#include "h.cuh"\nint g;\n')
    first = source_text(str(tmp_path / "a.cu"))
    assert b"int h1;" in first and b"int g;" in first and first.count(b"int h1;") == 1
    (tmp_path / "g.cuh").write_text('#include "h.cuh"\nint g2;\n')
    assert source_text(str(tmp_path / "a.cu")) != first
    real = source_text(str(ROOT / "mgg" / "kernels" / "dropout.cu"))
    assert b"mgg_lowbias32(uint32_t x)" in real   # the shared dropout hash comes along


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_plain_source_builds_with_defines_apart(kernel_cache_dir, monkeypatch):
    """build_cubin(defines=) passes -D macros and caches the variant apart from the plain build;
    NVSHMEM builds refuse them."""
    monkeypatch.setenv("MGG_KERNEL_CACHE", str(kernel_cache_dir))
    plain = build_cubin("dropout", "sm_90", nvshmem=False)
    variant = build_cubin("dropout", "sm_90", nvshmem=False, defines=("MGG_TEST_UNUSED_MACRO=1",))
    assert variant.path != plain.path and os.path.getsize(variant.path) > 1000
    with pytest.raises(ValueError, match="plain"):
        build_cubin("aggregate", "sm_90", nvshmem=True, defines=("X",))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_local_csr_gather_only_variant_compiles(tmp_path):
    """The benchmarks' gather floor (bench/harness/floors.py) builds local_csr.cu with
    MGG_CSR_GATHER_ONLY (every store predicated off): that variant must compile too (at -O0
    here, to keep CI short; the bench builds it as the runtime builds its cubin)."""
    import subprocess

    out = tmp_path / "gather.cubin"
    subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-cubin", "-std=c++17", "-DMGG_CSR_GATHER_ONLY",
                    "-Xcicc", "-O0", "-Xptxas", "-O0", str(ROOT / "mgg" / "kernels" / "local_csr.cu"),
                    "-o", str(out)], check=True, capture_output=True)
    assert out.read_bytes()[:4] == b"\x7fELF"
