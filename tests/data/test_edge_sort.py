"""Edge list -> CSR (mgg.data.edge_sort): the packed-key sort, on one thread and several, gives
exactly the CSR of a stable argsort of the targets; edge_index archives load through it."""
import logging

import numpy as np
import pytest

import mgg.data.edge_sort as edge_sort
from mgg.data import load_dataset, load_npz
from mgg.data.edge_sort import csr_from_checked_edges, id_range
from mgg.data.validate import GraphFormatError


def _reference(src, dst, n):
    """CSR by the textbook route: bincount + stable argsort."""
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    return indptr, np.asarray(src, dtype=np.int64)[np.argsort(dst, kind="stable")]


def _cases(rng):
    yield 1, np.zeros(0, np.int64), np.zeros(0, np.int64)
    yield 1, np.zeros(5, np.int64), np.zeros(5, np.int64)
    for n, e in ((7, 100), (50, 1000), (1000, 37), (300, 5000)):
        yield n, rng.integers(0, n, e), rng.integers(0, n, e)
    n, e = 200, 4000  # skewed: half the edges into one row, the rest sorted by target
    dst = np.concatenate([np.full(e // 2, 3), np.sort(rng.integers(0, n, e // 2))])
    yield n, rng.integers(0, n, e), dst
    yield 64, rng.integers(0, 64, 3000), np.repeat(np.arange(64), 3000 // 64 + 1)[:3000][::-1].copy()


@pytest.mark.parametrize("threads", [1, 2, 3, 5, 16])
def test_matches_stable_argsort_on_any_thread_count(threads, monkeypatch):
    monkeypatch.setattr(edge_sort, "_PARALLEL_MIN_EDGES", 8)  # small graphs take the threaded path
    rng = np.random.default_rng(threads)
    for n, src, dst in _cases(rng):
        want = _reference(src, dst, n)
        got = csr_from_checked_edges(src, dst, n, threads=threads)
        assert got[0].dtype == np.int64 and got[1].dtype == np.int64
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (threads, n, len(src))


def test_narrow_integer_dtypes(monkeypatch):
    monkeypatch.setattr(edge_sort, "_PARALLEL_MIN_EDGES", 8)
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 500, 20000), rng.integers(0, 500, 20000)
    want = _reference(src, dst, 500)
    for t in (1, 4):
        got = csr_from_checked_edges(src.astype(np.int32), dst.astype(np.uint16), 500, threads=t)
        assert got[1].dtype == np.int64
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_keys_too_wide_fall_back_to_argsort(monkeypatch):
    monkeypatch.setattr(edge_sort, "_KEY_BITS", 8)  # 100 nodes + 1000 edges need 7 + 10 bits
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 100, 1000), rng.integers(0, 100, 1000)
    got, want = csr_from_checked_edges(src, dst, 100, threads=1), _reference(src, dst, 100)
    assert np.array_equal(got[1], want[1])


def test_id_range_over_shares(monkeypatch):
    monkeypatch.setattr(edge_sort, "_PARALLEL_MIN_EDGES", 8)
    a = np.random.default_rng(2).integers(-50, 900, 1001)
    assert id_range(a, threads=4) == (int(a.min()), int(a.max()))


def _write_edge_index(path, rng, n=3000, e=40000, compressed=False, dtype=np.int64):
    ei = rng.integers(0, n, (2, e)).astype(dtype)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = rng.integers(0, 3, n)
    (np.savez_compressed if compressed else np.savez)(path, edge_index=ei, x=x, y=y, num_nodes=np.int64(n))
    return ei, x, y


@pytest.mark.parametrize("compressed", [False, True])
def test_edge_index_archive_loads_as_the_stable_csr(tmp_path, compressed, monkeypatch):
    monkeypatch.setattr(edge_sort, "_PARALLEL_MIN_EDGES", 1000)
    p = tmp_path / "pyg.npz"
    ei, x, y = _write_edge_index(p, np.random.default_rng(3), compressed=compressed, dtype=np.int32)
    g = load_dataset(str(p))  # the training app's entry point
    want = _reference(ei[0], ei[1], 3000)
    assert not g.mapped and g.num_nodes == 3000
    assert np.array_equal(g.indptr, want[0]) and np.array_equal(g.indices, want[1])
    assert np.array_equal(g.x, x) and np.array_equal(g.y, y)
    assert not isinstance(g.x, np.memmap)  # node data is copied: the graph outlives the file
    u = load_npz(p, to_undirected=True)
    pairs = set(zip(ei[0].tolist(), ei[1].tolist())) | set(zip(ei[1].tolist(), ei[0].tolist()))
    assert u.num_edges == len(pairs)
    assert set(zip(u.indices.tolist(), u.targets().tolist())) == pairs


def test_edge_index_out_of_range_is_named(tmp_path):
    p = tmp_path / "bad.npz"
    np.savez(p, edge_index=np.array([[0, 1, 2], [1, 0, 9]]), num_nodes=np.int64(3))
    with pytest.raises(GraphFormatError, match=r"bad.npz: edge_index\[1\]: edge_index\[1\]\[2\]=9 is out of range"):
        load_npz(p)


def test_slow_edge_index_load_says_how_to_convert_once(tmp_path, caplog, monkeypatch):
    import mgg.data.npz as npz

    p = tmp_path / "pyg.npz"
    _write_edge_index(p, np.random.default_rng(4), n=50, e=200)
    monkeypatch.setattr(npz, "CONVERT_HINT_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="mgg.data"):
        load_npz(p)
    assert f"python -m mgg.prepare {p} --out" in caplog.text and "M edges/s" in caplog.text
    caplog.clear()
    monkeypatch.setattr(npz, "CONVERT_HINT_SECONDS", 1e9)
    with caplog.at_level(logging.INFO, logger="mgg.data"):
        load_npz(p)
    assert "mgg.prepare" not in caplog.text
