"""Streamed graph files (mgg.data.npzstream, save_preset), per-rank footprints and the
`python -m mgg.prepare` command."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from mgg.apps.prepare_cli import main
from mgg.data.generators import preset, save_preset
from mgg.data.npz import load_npz
from mgg.data.npzstream import StreamedMember, write_npz_stream
from mgg.runtime.footprint import rank_footprints
from mgg.runtime.partition import partition_ranges

FIELDS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


def test_streamed_preset_equals_in_memory_preset(tmp_path):
    path = tmp_path / "g.npz"
    assert save_preset("products-like", str(path), scale=0.005, seed=5) == (12245, 309296)
    g, h = preset("products-like", 0.005, seed=5), load_npz(path, mmap=True)
    assert h.mapped and isinstance(h.indices, np.memmap)
    for k in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(h, k)), np.asarray(getattr(g, k)), err_msg=k)
    full = load_npz(path)  # the plain (not mapped) reader agrees too
    np.testing.assert_array_equal(full.indices, g.indices)


def test_stream_writer_chunks_torch_and_numpy(tmp_path):
    path = tmp_path / "s.npz"
    x = np.arange(35, dtype=np.float32).reshape(7, 5)
    chunks = [torch.from_numpy(x[:3]), x[3:4], torch.from_numpy(x[4:])]
    write_npz_stream(path, {"x": StreamedMember((7, 5), np.float32, iter(chunks)), "n": np.int64(7)})
    with np.load(path) as z:
        np.testing.assert_array_equal(z["x"], x)
        assert int(z["n"]) == 7


@pytest.mark.parametrize("rows", [6, 8])
def test_stream_writer_refuses_wrong_length_and_keeps_old_file(tmp_path, rows):
    path = tmp_path / "s.npz"
    path.write_bytes(b"old data")
    x = np.zeros((rows, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="member 'x'"):
        write_npz_stream(path, {"x": StreamedMember((7, 2), np.float32, iter([x]))})
    assert path.read_bytes() == b"old data"
    assert [p.name for p in tmp_path.iterdir()] == ["s.npz"]  # no temporary file left


def _footprints_dense(indptr, indices, p, f):
    """Independent reference: every rank's edges as (target, source) pairs, counted directly."""
    bounds = partition_ranges(indptr, p)
    tgt = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    out = []
    for r in range(p):
        lo, hi = bounds[r], bounds[r + 1]
        mine = (tgt >= lo) & (tgt < hi)
        src = indices[mine]
        far = src[(src < lo) | (src >= hi)]
        out.append((int(lo), int(hi), int(mine.sum()), len(far), len(set(far.tolist()))))
    return out


@pytest.mark.parametrize("p", [1, 3, 8])
def test_rank_footprints_match_direct_count(tmp_path, p):
    g = preset("reddit-like", 0.01, seed=1)
    got = rank_footprints(g.indptr, g.indices, p, num_features=g.x.shape[1])
    want = _footprints_dense(g.indptr, g.indices, p, g.x.shape[1])
    assert [(r.lo, r.hi, r.edges, r.remote_edges, r.remote_rows) for r in got] == want
    assert sum(r.nodes for r in got) == g.num_nodes and sum(r.edges for r in got) == g.num_edges
    assert all(r.rows_per_pe == max(w[1] - w[0] for w in want) for r in got)
    r0 = got[0]
    assert r0.host_bytes == 8 * (r0.nodes + 1) + 8 * r0.edges + r0.nodes * (4 * g.x.shape[1] + 11)


def test_prepare_cli_writes_sizes_and_refuses_overwrite(tmp_path, capsys):
    out = tmp_path / "p.npz"
    assert main(["products-like", "--scale", "0.002", "--out", str(out), "--ranks", "1,3"]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "on P=3 ranks" in text and "largest rank" in text
    assert sum(1 for ln in text.splitlines() if ln.strip().split(" ")[0] in ("0", "1", "2")) == 4  # 1 + 3 rank rows
    before = out.stat().st_mtime_ns
    with pytest.raises(SystemExit) as e:
        main(["products-like", "--scale", "0.002", "--out", str(out)])
    assert e.value.code == 2 and "exists; pass --force" in capsys.readouterr().err
    assert out.stat().st_mtime_ns == before
    assert main(["karate", "--out", str(out), "--force"]) == 0  # a non-preset, saved whole
    assert load_npz(out).num_nodes == 34


@pytest.mark.parametrize("argv,msg", [
    (["nosuch-graph", "--out", "x.npz"], "nosuch-graph"),
    (["karate", "--ranks", "2"], "not one"),
    (["karate"], "nothing to do"),
    (["karate", "--out", "x.npz", "--ranks", "two"], "--ranks"),
    (["papers-like", "--scale", "2", "--out", "x.npz"], "--scale"),
    (["karate", "--out", "x.npz", "--device", "tpu9"], "--device"),
] + ([] if torch.cuda.is_available() else [(["karate", "--out", "x.npz", "--device", "cuda"], "no CUDA GPU")]))
def test_prepare_cli_bad_input(tmp_path, capsys, argv, msg, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "x.npz")


def test_prepare_cli_truncated_file(tmp_path, capsys):
    out = tmp_path / "p.npz"
    save_preset("products-like", str(out), scale=0.002)
    data = out.read_bytes()
    bad = tmp_path / "bad.npz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit) as e:
        main([str(bad), "--ranks", "2"])
    assert e.value.code == 2 and "bad.npz" in capsys.readouterr().err


def test_read_rows_from_file_equals_slice(tmp_path):
    from mgg.data.rows import read_rows

    path = tmp_path / "g.npz"
    save_preset("products-like", str(path), scale=0.002, seed=2)
    g = load_npz(path, mmap=True)
    for arr in (g.x, g.indices, g.train_mask):
        assert isinstance(arr, np.memmap)
        for lo, hi in ((0, 1), (7, 300), (len(arr) - 5, len(arr)), (3, 3)):
            got = read_rows(arr, lo, hi)
            assert not isinstance(got, np.memmap) and got.dtype == arr.dtype
            np.testing.assert_array_equal(got, np.asarray(arr[lo:hi]))
    view = g.x[10:50]  # a view of a map: sliced and copied
    np.testing.assert_array_equal(read_rows(view, 2, 5), np.asarray(g.x[12:15]))
    np.testing.assert_array_equal(read_rows(np.arange(10), 4, 6), [4, 5])


def test_footprints_in_one_pass_over_uneven_chunks():
    """Several P at once from chunks that straddle rank boundaries equal each P sized alone, and
    ranks without edges (all edges in the first nodes) are counted too."""
    from mgg.runtime.footprint import footprints_from_chunks

    g = preset("products-like", 0.003, seed=4)
    E = g.num_edges
    cuts = [0, 1, 7, 1000, E // 3, E // 3 + 1, E - 5, E]
    chunks = ((a, b, torch.from_numpy(g.indices[a:b])) for a, b in zip(cuts, cuts[1:]))
    got = footprints_from_chunks(g.indptr, chunks, [1, 2, 5], num_features=100)
    for p in (1, 2, 5):
        assert got[p] == rank_footprints(g.indptr, g.indices, p, num_features=100)
    n = 1000
    indptr = np.concatenate([np.arange(11) * 5, np.full(n - 10, 50)]).astype(np.int64)  # 10 nodes hold every edge
    indices = np.random.default_rng(0).integers(0, n, 50)
    fps = footprints_from_chunks(indptr, iter([(0, 20, indices[:20]), (20, 50, indices[20:])]), [4])[4]
    want = _footprints_dense(indptr, indices, 4, 0)
    assert [(r.lo, r.hi, r.edges, r.remote_edges, r.remote_rows) for r in fps] == want
    with pytest.raises(ValueError, match="not contiguous"):
        footprints_from_chunks(indptr, iter([(0, 20, indices[:20]), (25, 50, indices[25:])]), [2])
    with pytest.raises(ValueError, match="cover 20 of 50"):
        footprints_from_chunks(indptr, iter([(0, 20, indices[:20])]), [2])


def test_prepare_dry_run_sizes_without_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["products-like", "--scale", "0.002", "--dry-run", "--ranks", "2,3"]) == 0
    text = capsys.readouterr().out
    assert "nothing written" in text and "on P=2 ranks" in text and "on P=3 ranks" in text
    assert list(tmp_path.iterdir()) == []
    g = preset("products-like", 0.002)
    rows = [ln.split() for ln in text.splitlines() if ln.strip()[:1].isdigit() and "[" in ln]
    want = rank_footprints(g.indptr, g.indices, 3, num_features=100)
    assert [int(r[5].replace(",", "")) for r in rows[2:]] == [w.remote_edges for w in want]  # the P=3 rows
    for argv, msg in ((["karate", "--dry-run"], "draws a preset"),
                      (["products-like", "--dry-run", "--out", "x.npz"], "leave out --out")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_reorder_nodes_writes_the_relabelled_graph_and_its_user_ids(tmp_path):
    import numpy as np

    from mgg.apps.prepare_cli import main
    from mgg.data import load_dataset
    from mgg.data.npz import load_npz
    from mgg.data.reorder import inverse_permutation

    out = tmp_path / "g.npz"
    assert main(["sbm", "--scale", "0.05", "--out", str(out), "--reorder-nodes", "degree"]) == 0
    g = load_npz(str(out))
    perm = g.user_ids  # stored in the file: user_ids[new] = the input's id
    assert load_npz(str(out), mmap=True).user_ids is not None and not (tmp_path / "g.perm.npy").exists()
    orig = load_dataset("sbm", scale=0.05, seed=0)
    assert sorted(perm.tolist()) == list(range(orig.num_nodes))  # a permutation, perm[new] = old
    np.testing.assert_array_equal(g.y, orig.y[perm])
    np.testing.assert_array_equal(g.x, orig.x[perm])
    inv = inverse_permutation(perm)  # every edge old j -> old i is new inv[j] -> inv[i]
    src = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    new_edges = set(zip(g.indices.tolist(), src.tolist()))
    osrc = np.repeat(np.arange(orig.num_nodes), np.diff(orig.indptr))
    assert new_edges == set(zip(inv[orig.indices].tolist(), inv[osrc].tolist()))
    deg = np.diff(g.indptr)  # degree order: in-degrees do not increase
    assert np.all(deg[:-1] >= deg[1:])


def test_prepare_help_shows_values_only():
    """--help gives a default where it is a value (--scale 1.0, --seed 0), never '(default: None)' or a
    switch's False."""
    from mgg.apps.prepare_cli import build_parser

    text = " ".join(build_parser().format_help().split())
    for absent in ("(default: None)", "(default: False)", "(default: )"):
        assert absent not in text, text
    for shown in ("(default: 1.0)", "(default: 0)", "(default: 16)", "(default: auto)"):
        assert shown in text, text



def test_device_auto_draws_presets_on_the_cpu_and_relabels_files_where_a_gpu_is():
    """--device auto (the default): a preset is drawn (and relabelled) on the CPU, the same file on
    every machine; a graph file is relabelled on the GPU when torch sees one."""
    from mgg.apps.prepare_cli import PrepareSettings, resolved_device

    assert resolved_device(PrepareSettings(dataset="products-like")) == "cpu"
    assert resolved_device(PrepareSettings(dataset="my_graph.npz")) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolved_device(PrepareSettings(dataset="my_graph.npz", device="cpu")) == "cpu"
    assert PrepareSettings(dataset="x").device == "auto"
