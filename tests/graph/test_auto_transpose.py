"""DistGraph's transpose="auto" (mgg.graph.rank_rows.auto_transpose): the host exchange for a
memory-mapped graph at P > 1 unless each rank's GPU has room to scan the whole CSR."""
import types

import numpy as np
import pytest
import torch

from mgg.graph import rank_rows as graph_mod
from mgg.graph.rank_rows import auto_transpose


@pytest.fixture
def mapped(tmp_path):
    idx = np.lib.format.open_memmap(tmp_path / "i.npy", mode="w+", dtype=np.int64, shape=(1000,))
    idx[:] = np.arange(1000) % 10
    return np.linspace(0, 1000, 11).astype(np.int64), idx


def _gpu(monkeypatch, total_bytes):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(total_memory=total_bytes))


def test_in_memory_graphs_and_one_rank_scan(mapped):
    indptr, idx = mapped
    assert auto_transpose(indptr, np.asarray(idx).copy(), 4, "cpu") == "scan"
    assert auto_transpose(indptr, idx, 1, "cpu") == "scan"


def test_a_mapped_graph_on_cpu_ranks_is_exchanged(mapped):
    assert auto_transpose(*mapped, 2, "cpu") == "exchange"


def test_gpu_ranks_scan_what_fits_and_exchange_the_rest(mapped, monkeypatch):
    indptr, idx = mapped
    need = 8 * (len(idx) + len(indptr))
    _gpu(monkeypatch, 8 * need)   # a CSR of 1/8 of the GPU: scanned
    assert auto_transpose(indptr, idx, 4, "gpu", local_rank=3) == "scan"
    _gpu(monkeypatch, 8 * need - 8)
    assert auto_transpose(indptr, idx, 4, "gpu") == "exchange"
    _gpu(monkeypatch, 1 << 50)    # a huge GPU: still capped at SCAN_MAX_BYTES
    monkeypatch.setattr(graph_mod, "SCAN_MAX_BYTES", need - 1)
    assert auto_transpose(indptr, idx, 4, "gpu") == "exchange"
