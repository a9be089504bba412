"""Memory-mapped .npz graphs (mgg.data.npzmap, load_npz(mmap=True)): the same arrays as the full
read, rows read per rank equal the whole-array prepare, and truncated members give one-line errors
naming file and member (CLI: exit 2 on every rank, nothing overwritten)."""
import dataclasses
import io
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from mgg.data import Graph, GraphFormatError, load_dataset, load_npz, save_npz
from mgg.data.npzmap import mmap_members
from mgg.data.prepare import prepare_graph
from mgg.data.validate import check_index_share
from mgg.runtime import Communicator
from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env as env


def _graph(masks=True, x=True) -> Graph:
    g = load_dataset("sbm", scale=0.05, seed=3)
    g = dataclasses.replace(g, y=np.where(np.arange(g.num_nodes) % 7 == 0, -1, g.y))  # some unlabelled
    if not masks:
        g = dataclasses.replace(g, train_mask=None, val_mask=None, test_mask=None)
    else:
        g = dataclasses.replace(g, **{k: getattr(g, k) & (g.y >= 0) for k in ("train_mask", "val_mask", "test_mask")})
    return g if x else dataclasses.replace(g, x=None)


def _truncate_member(src, dst, member: str, keep: float = 0.5) -> None:
    """Rewrite the archive with `member`'s .npy bytes cut to `keep` of its data (header intact)."""
    with zipfile.ZipFile(src) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    raw = members[member + ".npy"]
    arr_len = len(np.load(io.BytesIO(raw)).tobytes())
    members[member + ".npy"] = raw[: len(raw) - arr_len + int(arr_len * keep)]
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_mapped_arrays_equal_full_read(tmp_path):
    g = _graph()
    p = tmp_path / "g.npz"
    save_npz(g, p)
    m = load_npz(p, mmap=True)
    full = load_npz(p)
    assert m.mapped and not full.mapped
    for k in ("indices", "x", "y", "train_mask"):
        assert isinstance(getattr(m, k), np.memmap), k
        assert np.array_equal(getattr(m, k), getattr(full, k)), k
    assert type(m.indptr) is np.ndarray and np.array_equal(m.indptr, full.indptr)
    assert load_dataset(str(p)).mapped and not load_dataset(str(p), mmap=False).mapped


def test_compressed_members_are_read_whole(tmp_path):
    g = _graph()
    p = tmp_path / "c.npz"
    save_npz(g, p, compressed=True)
    arrays = mmap_members(str(p))
    assert not any(isinstance(a, np.memmap) for a in arrays.values())
    m = load_npz(p, mmap=True)
    assert m.mapped and np.array_equal(m.indices, g.indices)


@pytest.mark.parametrize("masks,x", [(True, True), (False, False), (True, False)])
def test_rows_equal_whole_array_prepare(tmp_path, masks, x):
    """Row blocks of the deferred prepare of a mapped graph = the whole-array prepare, and the
    global figures agree (one process: the whole range gives the global counts)."""
    g = _graph(masks, x)
    p = tmp_path / "g.npz"
    save_npz(g, p)
    whole = prepare_graph(g, seed=5)
    deferred = prepare_graph(load_npz(p, mmap=True), seed=5, deferred=True)
    comm = Communicator()
    n = g.num_nodes
    for lo, hi in ((0, n), (0, n // 3), (n // 3, n)):
        a, b = whole.rows(lo, hi), deferred.rows(lo, hi, comm)
        for f in ("x", "y", "train", "val", "test"):
            assert getattr(a, f).dtype == getattr(b, f).dtype and np.array_equal(getattr(a, f), getattr(b, f)), f
    b = deferred.rows(0, n, comm)
    assert b.n_train == int(whole.train.sum()) and b.num_classes == whole.num_classes


def test_bad_rows_name_global_rows(tmp_path):
    g = _graph()
    x = g.x.copy()
    x[g.num_nodes - 2, 1] = np.nan
    p = tmp_path / "nan.npz"
    save_npz(dataclasses.replace(g, x=None), p)  # save_npz validates: add the NaN afterwards
    arrays = dict(np.load(p))
    np.savez(p, **arrays, x=x)
    d = prepare_graph(load_npz(p, mmap=True), deferred=True)
    d.rows(0, 10, Communicator())  # rows without the NaN are fine
    with pytest.raises(GraphFormatError, match=f"x contains NaN at row {g.num_nodes - 2}"):
        d.rows(g.num_nodes // 2, g.num_nodes, Communicator())


def test_index_shares_cover_every_entry(tmp_path):
    g = _graph()
    ind = g.indices.copy()
    p = tmp_path / "g.npz"
    for pos in (0, len(ind) // 2, len(ind) - 1):
        bad = ind.copy()
        bad[pos] = g.num_nodes
        np.savez(p, indptr=g.indptr, indices=bad)
        m = load_npz(p, mmap=True)
        hits = []
        for part in range(3):
            try:
                check_index_share(m, part, 3)
            except GraphFormatError as e:
                hits.append((part, str(e)))
        assert len(hits) == 1 and f"indices[{pos}]=" in hits[0][1], hits


@pytest.mark.parametrize("member", ["indices", "x", "y", "indptr", "train_mask"])
def test_truncated_member_is_one_line_error(tmp_path, member):
    good = tmp_path / "good.npz"
    save_npz(_graph(), good)
    bad = tmp_path / "bad.npz"
    _truncate_member(good, bad, member)
    with pytest.raises(GraphFormatError) as e:
        load_npz(bad, mmap=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad}: {member}: truncated"), msg


def test_member_running_past_file_end(tmp_path):
    """Central directory sizes larger than the file holds: caught before mapping."""
    good = tmp_path / "good.npz"
    save_npz(_graph(), good)
    data = bytearray(good.read_bytes())
    z = zipfile.ZipFile(good)
    info = z.getinfo("x.npy")
    cd = data.index(b"PK\x01\x02" + data[z.start_dir + 4: z.start_dir + 6], z.start_dir)  # first central entry
    # patch the size fields of x.npy's central entry (offsets 20 and 24 of the entry)
    pos = data.index(b"x.npy", z.start_dir) - 46
    assert data[pos: pos + 4] == b"PK\x01\x02" and cd <= pos
    big = (info.file_size + 10 * len(data)).to_bytes(4, "little")
    data[pos + 20: pos + 24] = big
    data[pos + 24: pos + 28] = big
    bad = tmp_path / "past.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(GraphFormatError, match=r"past\.npz: x: truncated: the member needs bytes"):
        load_npz(bad, mmap=True)


def _cli(tmp_path, bad, np_=None):
    metrics = tmp_path / "m.json"
    metrics.write_text("keep")
    cmd = [sys.executable, "-m", "mgg.train", "--dataset", str(bad), "--epochs", "1", "--backend", "cpu",
           "--no-progress", "--metrics-json", str(metrics)]
    if np_:
        cmd = [*MPIRUN, "-np", str(np_), *cmd]
    before = bad.read_bytes()
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, errors="replace")
    assert bad.read_bytes() == before and metrics.read_text() == "keep"  # nothing overwritten
    return r


@pytest.mark.slow
def test_cli_truncated_member_exit_2(tmp_path):
    good = tmp_path / "good.npz"
    save_npz(_graph(), good)
    bad = tmp_path / "bad.npz"
    _truncate_member(good, bad, "indices")
    r = _cli(tmp_path, bad)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert f"{bad}: indices: truncated" in lines[0] and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.needs_mpirun
def test_cli_truncated_member_every_rank(tmp_path):
    good = tmp_path / "good.npz"
    save_npz(_graph(), good)
    bad = tmp_path / "bad.npz"
    _truncate_member(good, bad, "x")
    r = _cli(tmp_path, bad, np_=2)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = [l for l in r.stderr.splitlines() if "error" in l]  # every rank fails; rank 0 says why, once
    assert len(line) == 1 and line[0].startswith("error: ") and f"{bad}: x: truncated" in line[0], r.stderr
