"""The benchmark floors count what an aggregation must read: A + I's stream and the bytes once."""
from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from bench.harness.floors import cuda_source, floor_bytes, with_self_entries


def _random_csr(n: int, seed: int):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 5, n)
    deg[n // 2] = 0  # an empty row
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    return indptr, rng.integers(0, n, int(indptr[-1])).astype(np.int32)


def test_with_self_entries_appends_each_rows_own_index():
    indptr, indices = _random_csr(40, 0)
    ptr, idx = with_self_entries(indptr, indices)
    assert ptr.dtype == np.int64 and idx.dtype == np.int32 and len(idx) == len(indices) + 40
    for r in range(40):
        row = idx[ptr[r]:ptr[r + 1]]
        assert list(row) == list(indices[indptr[r]:indptr[r + 1]]) + [r]


def test_floor_bytes_counts_each_row_once_and_self_rows_as_gathered():
    indptr, indices = _random_csr(30, 1)
    n, e = 30, len(indices)
    base = dict(local_indices=indices, local_indptr=indptr, n_local=n, num_local_edges=e,
                num_remote_edges=0, halo_size=0)
    dp = 8
    row = 4 * dp
    plain = floor_bytes(SimpleNamespace(has_self=False, **base), dp)
    uniq = len(set(indices.tolist()))
    assert uniq < n  # the test graph leaves rows unread
    assert plain["compulsory"] == 4 * e + 8 * (n + 1) + row * (uniq + n)
    assert plain["gathered"] == row * e
    selfish = floor_bytes(SimpleNamespace(has_self=True, **base), dp)
    # every row is read once (its own row), not the distinct sources plus every row again
    assert selfish["compulsory"] == 4 * e + 8 * (n + 1) + row * (n + n)
    assert selfish["gathered"] == row * (e + n)


def test_floor_note_says_at_or_above_the_floor():
    """Below the floor nothing; within FLOOR_SPREAD of it "at the gather floor" with the ratio;
    beyond that the floor is called wrong."""
    from bench.harness.floors import FLOOR_SPREAD, floor_note

    assert floor_note(0.8, 1.0) == "" and floor_note(1.0, 1.0) == ""
    assert "at the gather floor: 100.5%" in floor_note(1.005, 1.0)
    assert FLOOR_SPREAD == 0.01 and "above the gather floor (102.0%)" in floor_note(1.02, 1.0)


#: one template instance of each gather-floor source, as gather_bandwidth names them
_GATHER_INSTANCES = {
    "gather_sum": "gather_sum<8, true>(const float4*, const int*, long long, int, float4*)",
    "gather_sum_shfl": "gather_sum_shfl<4, 16, true>(const float4*, const int*, long long, float4*)",
    "gather_rows": "gather_rows<16, true, true>(const float4*, const int*, const long long*, long long, float4*)",
}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("name", sorted(_GATHER_INSTANCES))
def test_gather_floor_sources_compile(name, tmp_path):
    """The gather floor's CUDA sources (bench/harness/<name>.cu, the text cuda_source hands to
    CuPy) compile at C++17 with an instance of their template (at -O0, to keep CI short)."""
    src = tmp_path / f"{name}.cu"
    src.write_text(cuda_source(name) + f"template __global__ void {_GATHER_INSTANCES[name]};\n")
    out = tmp_path / f"{name}.cubin"
    subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-cubin", "-std=c++17", "-Xcicc", "-O0", "-Xptxas", "-O0",
                    str(src), "-o", str(out)], check=True, capture_output=True)
    assert out.read_bytes()[:4] == b"\x7fELF"
