"""mgg.runtime.transfer on the CPU (the staged CUDA path: tests/runtime/test_transfer_gpu.py)."""
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from mgg.data.rows import mapped_file
from mgg.runtime.transfer import device_to_host, fill_stage, host_to_device


def test_cpu_round_trip_is_a_plain_copy():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    t = host_to_device(a, "cpu", torch.int32)
    assert t.dtype == torch.int32 and t.tolist() == a.tolist()
    assert np.array_equal(device_to_host(t), a.astype(np.int32))
    assert host_to_device(a, "cpu", np.float32).dtype == torch.float32  # a numpy dtype works too


def _mapping_rss_kb(addr: int) -> int:
    """Resident KiB of this process's mapping that holds address `addr` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError("no mapping holds the address")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_mapped_file_is_staged_from_the_file_not_through_the_map(tmp_path):
    """The staging of a memory-mapped array reads the file (positioned reads), so none of the
    map's pages become resident in this process; an ordinary array is copied."""
    a = np.random.default_rng(0).integers(0, 1 << 40, 2_000_000, dtype=np.int64)  # 16 MB
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert mapped_file(m) is not None and mapped_file(np.asarray(m)) is None and mapped_file(a) is None
    stage = np.zeros(m.nbytes - 4096, dtype=np.uint8)
    src = np.ascontiguousarray(m).reshape(-1).view(np.uint8)
    with ThreadPoolExecutor(2) as pool:
        fill_stage(stage, src, 4096, mapped_file(m), pool)
        assert np.array_equal(stage, a.view(np.uint8)[4096:])
        assert _mapping_rss_kb(src.ctypes.data) < 64  # at most a few pages (the .npy header's)
        stage[:] = 0
        fill_stage(stage, src, 4096, None, pool)  # through the map: its pages fault in
        assert np.array_equal(stage, a.view(np.uint8)[4096:])
        assert _mapping_rss_kb(src.ctypes.data) > 10_000
