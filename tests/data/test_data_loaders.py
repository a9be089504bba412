"""Loaders round-trip small graphs and report malformed files with file name + field."""
import gzip
import os
import types

import numpy as np
import pytest
import scipy.sparse as sp

from mgg.data import (Graph, GraphFormatError, DATASET_NAMES, csr_from_edges, from_pyg, from_scipy,
                      load_dataset, load_edgelist, load_karate, load_npz, load_ogb, save_edgelist,
                      save_npz, to_scipy)

SRC = np.array([0, 1, 2, 3, 4, 0, 2])
DST = np.array([1, 2, 3, 4, 0, 3, 0])
N = 6  # node 5 isolated


def _ref(with_data=True):
    indptr, indices = csr_from_edges(SRC, DST, N)
    kw = {}
    if with_data:
        rng = np.random.default_rng(0)
        kw = dict(x=rng.standard_normal((N, 3)).astype(np.float32), y=np.array([0, 1, 2, 0, 1, -1]),
                  train_mask=np.array([1, 1, 0, 0, 0, 0], bool), val_mask=np.array([0, 0, 1, 0, 0, 0], bool),
                  test_mask=np.array([0, 0, 0, 1, 1, 0], bool))
    return Graph(indptr, indices, name="ref", **kw)


def _same(a: Graph, b: Graph, data=True):
    a, b = a.sort_rows(), b.sort_rows()
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
    if data:
        for k in ("x", "y", "train_mask", "val_mask", "test_mask"):
            assert np.array_equal(getattr(a, k), getattr(b, k)), k


def _raises(fn, fname, field, *fragments):
    with pytest.raises(GraphFormatError) as ei:
        fn()
    msg = str(ei.value)
    assert fname in msg and field in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


# ------------------------------------------------------------------------------- npz
def test_npz_roundtrip_csr(tmp_path):
    p = tmp_path / "g.npz"
    save_npz(_ref(), p)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]  # atomic, no leftovers
    _same(load_npz(p), _ref())


def test_npz_edge_index_layout(tmp_path):
    p = tmp_path / "ei.npz"
    r = _ref()
    np.savez(p, edge_index=np.stack([SRC, DST]).astype(np.int32), x=r.x, y=r.y, num_nodes=N)
    g = load_npz(p)
    _same(g, Graph(r.indptr, r.indices), data=False)
    assert g.num_nodes == N and g.x.dtype == np.float32


def test_npz_num_nodes_inferred_from_x(tmp_path):
    p = tmp_path / "ei.npz"
    np.savez(p, edge_index=np.stack([SRC, DST]), x=np.zeros((9, 2), np.float32))
    assert load_npz(p).num_nodes == 9


def test_npz_truncated(tmp_path):
    p = tmp_path / "bad.npz"
    save_npz(_ref(), p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    _raises(lambda: load_npz(p), "bad.npz", "file")


def test_npz_garbage(tmp_path):
    p = tmp_path / "junk.npz"
    p.write_bytes(b"not a zip at all")
    _raises(lambda: load_npz(p), "junk.npz", "file")


def test_npz_field_errors(tmp_path):
    p = tmp_path / "f.npz"
    np.savez(p, edge_index=np.array([[0, 1], [1, -3]]))
    _raises(lambda: load_npz(p), "f.npz", "edge_index", "is negative")
    np.savez(p, edge_index=np.array([[0.0, 1.0], [1.0, 0.0]]))
    _raises(lambda: load_npz(p), "f.npz", "edge_index", "not an integer")
    np.savez(p, edge_index=np.array([[0, 1], [1, 5]]), num_nodes=3)
    _raises(lambda: load_npz(p), "f.npz", "edge_index", "out of range")
    np.savez(p, indptr=np.array([0, 2, 1]), indices=np.array([0]))
    _raises(lambda: load_npz(p), "f.npz", "indptr", "not monotone")
    x = np.zeros((2, 2), np.float32); x[1, 0] = np.nan
    np.savez(p, indptr=np.array([0, 1, 1]), indices=np.array([1]), x=x)
    _raises(lambda: load_npz(p), "f.npz", "x", "NaN at row 1")
    np.savez(p, indptr=np.array([0, 1, 1]), indices=np.array([1]), x=np.zeros((3, 2)))
    _raises(lambda: load_npz(p), "f.npz", "x", "x has 3 rows")
    np.savez(p, indptr=np.array([0]), indices=np.array([], np.int64))
    _raises(lambda: load_npz(p), "f.npz", "indptr", "empty graph")
    np.savez(p, x=np.zeros((2, 2)))
    _raises(lambda: load_npz(p), "f.npz", "edge_index", "missing")


# ----------------------------------------------------------------------------- scipy
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok"])
def test_from_scipy_all_formats(fmt):
    r = _ref()
    A = sp.coo_matrix((np.ones(len(SRC)), (DST, SRC)), shape=(N, N)).asformat(fmt)
    g = from_scipy(A, x=r.x, y=r.y, train_mask=r.train_mask, val_mask=r.val_mask, test_mask=r.test_mask)
    _same(g, r)
    _same(from_scipy(to_scipy(g)), g, data=False)


def test_from_scipy_errors():
    _raises(lambda: from_scipy(sp.csr_matrix((3, 4))), "<scipy matrix>", "matrix", "square")
    _raises(lambda: from_scipy(sp.csr_matrix((3, 3)), x=np.zeros((2, 1))), "<scipy matrix>", "x")


# ------------------------------------------------------------------------------- pyg
def test_from_pyg_duck_typed():
    torch = pytest.importorskip("torch")
    r = _ref()
    data = types.SimpleNamespace(edge_index=torch.tensor(np.stack([SRC, DST])), num_nodes=N,
                                 x=torch.tensor(r.x), y=torch.tensor(r.y), train_mask=torch.tensor(r.train_mask),
                                 val_mask=torch.tensor(r.val_mask), test_mask=torch.tensor(r.test_mask))
    _same(from_pyg(data), r)
    bad = types.SimpleNamespace(edge_index=torch.tensor([[0, 1], [1, 9]]), num_nodes=3)
    _raises(lambda: from_pyg(bad, name="d"), "<pyg d>", "edge_index", "out of range")


# -------------------------------------------------------------------------- edgelist
@pytest.mark.parametrize("suffix,sep", [(".txt", " "), (".edges", "\t"), (".el", ","), (".csv", ", ")])
def test_edgelist_roundtrip(tmp_path, suffix, sep):
    p = tmp_path / f"g{suffix}"
    lines = ["# comment", "% another"] + [f"{s}{sep}{d}" for s, d in zip(SRC, DST)] + [""]
    p.write_text("\n".join(lines))
    g = load_edgelist(p, num_nodes=N)
    _same(g, _ref(False), data=False)
    assert load_edgelist(p).num_nodes == 5  # inferred max id + 1


def test_edgelist_gz_and_save(tmp_path):
    p = tmp_path / "g.txt"
    save_edgelist(_ref(False), p)
    _same(load_edgelist(p, num_nodes=N), _ref(False), data=False)
    pz = tmp_path / "g.txt.gz"
    pz.write_bytes(gzip.compress(p.read_bytes()))
    _same(load_edgelist(pz, num_nodes=N), _ref(False), data=False)


def test_edgelist_errors(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("# hdr\n0 1\n1 x\n")
    _raises(lambda: load_edgelist(p), "bad.txt", "edges", "line 3", "'x'", "not an integer")
    p.write_text("0 1\n1 2 3\n")
    _raises(lambda: load_edgelist(p), "bad.txt", "edges", "line 2", "expected 2 columns")
    p.write_text("0 1\n1 2.5\n")
    _raises(lambda: load_edgelist(p), "bad.txt", "edges", "line 2")
    p.write_text("0 1\n-1 2\n")
    _raises(lambda: load_edgelist(p), "bad.txt", "edges", "negative")
    p.write_text("0 1\n1 7\n")
    _raises(lambda: load_edgelist(p, num_nodes=3), "bad.txt", "edges", "out of range")
    p.write_text("# nothing\n")
    _raises(lambda: load_edgelist(p), "bad.txt", "edges", "no data")
    pz = tmp_path / "trunc.txt.gz"
    pz.write_bytes(gzip.compress(b"0 1\n1 2\n" * 1000)[:40])
    _raises(lambda: load_edgelist(pz), "trunc.txt.gz", "edges")
    _raises(lambda: load_edgelist(tmp_path / "missing.txt"), "missing.txt", "edges", "not found")


@pytest.mark.parametrize("header,body", [("src,dst", "0,1\n1,2\n"), ("source target", "0 1\n1 2\n")])
def test_edgelist_header_line_gets_a_hint(tmp_path, header, body):
    p = tmp_path / "e.csv"
    p.write_text(f"{header}\n{body}")
    _raises(lambda: load_edgelist(p), "e.csv", "edges", "line 1", header, "looks like a header",
            "start it with '#'")
    p.write_text(f"# {header}\n{body}")  # the fix the message names
    assert load_edgelist(p).num_edges == 2
    p.write_text(f"{body}x,y\n" if "," in body else f"{body}x y\n")  # a bad line further down is no header
    _raises(lambda: load_edgelist(p), "e.csv", "edges", "line 3", "not an integer")


# ------------------------------------------------------------------------------- ogb
def _write_ogb(root, gz=True, scheme="time"):
    r = _ref()
    raw = root / "raw"
    raw.mkdir(parents=True)
    sd = root / "split" / scheme
    sd.mkdir(parents=True)

    def w(path, text):
        if gz:
            (path.parent / (path.name + ".gz")).write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)

    w(raw / "edge.csv", "".join(f"{s},{d}\n" for s, d in zip(SRC, DST)))
    w(raw / "num-node-list.csv", f"{N}\n")
    w(raw / "node-feat.csv", "".join(",".join(repr(float(v)) for v in row) + "\n" for row in r.x))
    w(raw / "node-label.csv", "".join(("nan" if v < 0 else str(v)) + "\n" for v in r.y))
    for stem, m in (("train", r.train_mask), ("valid", r.val_mask), ("test", r.test_mask)):
        w(sd / f"{stem}.csv", "".join(f"{i}\n" for i in np.flatnonzero(m)))
    return r


@pytest.mark.parametrize("gz", [True, False])
def test_ogb_roundtrip(tmp_path, gz):
    r = _write_ogb(tmp_path / "ogbn-toy", gz=gz)
    g = load_ogb(tmp_path / "ogbn-toy")
    _same(g, r)
    assert g.name == "ogbn-toy"
    u = load_ogb(tmp_path / "ogbn-toy", to_undirected=True)
    assert u.num_edges == 2 * len(SRC) and np.array_equal(u.reverse().sort_rows().indices, u.indices)
    _same(load_dataset(str(tmp_path / "ogbn-toy")), r)


def test_ogb_errors(tmp_path):
    root = tmp_path / "o"
    _write_ogb(root, gz=False)
    (root / "raw" / "node-feat.csv").write_text("1.0,2.0,3.0\n" * (N - 1) + "1.0,nan,3.0\n")
    _raises(lambda: load_ogb(root), "node-feat.csv", "x", "NaN at row 5")
    (root / "raw" / "node-feat.csv").write_text("1.0,2.0,3.0\n" * (N + 1))
    _raises(lambda: load_ogb(root), "node-feat.csv", "x", "7 rows")
    (root / "raw" / "node-feat.csv").write_text("1.0,2.0,3.0\n" * N)
    (root / "raw" / "edge.csv").write_text("0,1\n1\n")
    _raises(lambda: load_ogb(root), "edge.csv", "edges", "line 2", "expected 2 columns")
    (root / "raw" / "edge.csv").write_text("0,1\n1,2\n")
    (root / "split" / "time" / "train.csv").write_text("0\n99\n")
    _raises(lambda: load_ogb(root), "train.csv", "train_mask", "out of range")
    _raises(lambda: load_ogb(root, split="nope"), "split", "split", "nope")
    _raises(lambda: load_ogb(tmp_path), str(tmp_path), "edges", "not an ogbn-style")


# -------------------------------------------------------------------------- registry
def test_default_dataset_is_karate():
    g = load_dataset("default")
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (34, 156, 34, 2)
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (8, 10, 16)
    assert not (g.train_mask & g.val_mask).any() and not (g.val_mask & g.test_mask).any()
    assert np.bincount(g.y[g.train_mask]).tolist() == [4, 4]
    assert g.y[0] == 0 and g.y[33] == 1  # Mr. Hi and the officer
    assert g.fingerprint() == load_karate().fingerprint()
    assert np.array_equal(g.reverse().sort_rows().indices, g.indices)  # undirected


def test_embedded_karate_matches_networkx():
    """The embedded edge list and factions are networkx's karate_club_graph() (an independent copy)."""
    nx = pytest.importorskip("networkx")
    from mgg.data.karate import KARATE_CLASSES, karate_edges, karate_labels

    G = nx.karate_club_graph()
    assert karate_edges().tolist() == sorted(sorted(e) for e in G.edges())
    assert [KARATE_CLASSES[c] for c in karate_labels()] == [G.nodes[v]["club"] for v in sorted(G.nodes())]
    g = load_karate()
    ref = nx.to_scipy_sparse_array(G, nodelist=range(34), weight=None, format="csr").sorted_indices()
    assert np.array_equal(g.indptr, ref.indptr) and np.array_equal(g.indices, ref.indices)


def test_load_dataset_names_and_paths(tmp_path):
    for name in DATASET_NAMES:
        if name.endswith("-like"):
            g = load_dataset(name, scale=1e-4 if name != "papers-like" else 2e-6)
            assert g.num_edges > 0
        else:
            assert load_dataset(name, scale=0.1).num_nodes > 0
    p = tmp_path / "g.npz"
    save_npz(_ref(), p)
    _same(load_dataset(str(p)), _ref())
    q = tmp_path / "g.el"
    save_edgelist(_ref(False), q)
    assert load_dataset(q).num_edges == len(SRC)


def test_load_dataset_unknown():
    with pytest.raises(ValueError) as ei:
        load_dataset("cora-full-nope")
    for n in ("default", "karate", "sbm", "reddit-like", "products-like", "papers-like"):
        assert n in str(ei.value)
    with pytest.raises(ValueError):
        load_dataset("sbm", scale=0)
