"""mgg.data.rows.read_rows: rows of a memory-mapped .npy read by positioned reads (several
blocks on threads) equal the slice, and a short file is not read past its end."""
import numpy as np

from mgg.data import rows as rows_mod
from mgg.data.rows import read_rows


def test_blocked_threaded_reads_equal_the_slice(tmp_path, monkeypatch):
    monkeypatch.setattr(rows_mod, "READ_BLOCK", 4096)  # many blocks, on the thread pool
    a = np.random.default_rng(0).standard_normal((5000, 7)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    for lo, hi in ((0, 5000), (13, 4099), (4999, 5000), (7, 7)):
        got = read_rows(m, lo, hi)
        assert type(got) is np.ndarray and got.flags.c_contiguous
        np.testing.assert_array_equal(got, a[lo:hi])


def test_truncated_file_falls_back_to_the_map(tmp_path):
    a = np.arange(100, dtype=np.int64)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert rows_mod.pread_into(m.filename, np.empty(200, np.int64), int(m.offset)) is False
