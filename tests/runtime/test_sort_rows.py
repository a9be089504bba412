"""mgg.runtime.transpose.sort_within_rows (every CSR row's entries ascending) against numpy's
per-row sort, and DistGraph's forward plans built from it: rows ascend, and every aggregation
kind still equals the float64 dense reference on a graph whose lists were generated unsorted."""
import numpy as np
import pytest
import torch

import mgg.runtime.transpose as transpose
from mgg.graph import DistGraph, RuntimeConfig
from mgg.runtime.transpose import sort_within_rows


def _random_rows(rng, n, max_deg):
    deg = rng.integers(0, max_deg + 1, n)
    ip = np.zeros(n + 1, np.int64)
    np.cumsum(deg, out=ip[1:])
    return ip, rng.integers(0, max(n, 1), int(ip[-1])).astype(np.int64)


def _numpy_sorted(ip, idx):
    return np.concatenate([np.sort(idx[ip[i]: ip[i + 1]]) for i in range(len(ip) - 1)] + [np.zeros(0, np.int64)])


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 26])
def test_matches_numpy_per_row_sort(monkeypatch, chunk):
    monkeypatch.setattr(transpose, "SORT_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(30):
        ip, idx = _random_rows(rng, int(rng.integers(0, 50)), 7)
        got = sort_within_rows(torch.from_numpy(ip), torch.from_numpy(idx)).numpy()
        assert np.array_equal(got, _numpy_sorted(ip, idx))


def test_sorted_input_is_returned_unchanged_and_input_never_written():
    rng = np.random.default_rng(0)
    ip, idx = _random_rows(rng, 200, 9)
    srt = torch.from_numpy(_numpy_sorted(ip, idx))
    assert sort_within_rows(torch.from_numpy(ip), srt) is srt  # no copy when already sorted
    t = torch.from_numpy(idx.copy())
    before = t.clone()
    out = sort_within_rows(torch.from_numpy(ip), t)
    assert torch.equal(t, before) and out is not t


def test_hub_row_longer_than_a_chunk(monkeypatch):
    monkeypatch.setattr(transpose, "SORT_CHUNK", 4)
    ip = np.array([0, 2, 12, 13], np.int64)  # the middle row alone exceeds the chunk
    idx = np.array([5, 1, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 3], np.int64)
    got = sort_within_rows(torch.from_numpy(ip), torch.from_numpy(idx)).numpy()
    assert np.array_equal(got, _numpy_sorted(ip, idx))


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
def test_distgraph_forward_rows_ascend_and_aggregate_exactly(kind):
    from mgg.runtime import world

    rng = np.random.default_rng(3)
    n = 60
    ip, idx = _random_rows(rng, n, 8)
    dg = DistGraph(ip, idx, world(), RuntimeConfig(backend="cpu"))
    plan = dg.plan(kind)
    for t in range(n):
        row = plan.local_indices[plan.local_indptr[t]: plan.local_indptr[t + 1]]
        assert np.all(np.diff(row) >= 0)
    a = np.zeros((n, n))
    np.add.at(a, (np.repeat(np.arange(n), np.diff(ip)), idx), 1.0)
    deg = a.sum(1)
    if kind == "mean":
        w = a / np.maximum(deg, 1)[:, None]
    elif kind == "gcn":
        dinv = 1.0 / np.sqrt(deg + 1.0)
        w = dinv[:, None] * (a + np.eye(n)) * dinv[None, :]
    else:
        w = a + (np.eye(n) if kind == "sum_self" else 0)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    got = dg.aggregate(torch.from_numpy(x), kind).numpy()
    np.testing.assert_allclose(got, w @ x.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_sort_equals_cpu_sort():
    rng = np.random.default_rng(5)
    ip, idx = _random_rows(rng, 5000, 40)
    cpu = sort_within_rows(torch.from_numpy(ip), torch.from_numpy(idx))
    gpu = sort_within_rows(torch.from_numpy(ip).cuda(), torch.from_numpy(idx).cuda())
    assert torch.equal(cpu, gpu.cpu())
