"""OGB's binary raw layout (ogbn-papers100M's raw/data.npz + raw/node-label.npz) reads as the
same graph as the text layout of the same data; --undirected symmetrises it."""
import gzip

import numpy as np
import pytest

from mgg.data import GraphFormatError, load_dataset, load_ogb
from mgg.data.formats import format_for


def _data(seed=0, n=40, e=300, f=5, classes=4):
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, (2, e))
    x = rng.standard_normal((n, f)).astype(np.float32)
    label = rng.integers(0, classes, n).astype(np.float64)
    label[rng.random(n) < 0.3] = np.nan  # unlabelled, as in papers100M
    labelled = np.flatnonzero(~np.isnan(label))
    split = {"train": labelled[::2], "valid": labelled[1::4], "test": labelled[3::4]}
    return ei, x, label, split


def _write_split(root, split):
    sd = root / "split" / "time"
    sd.mkdir(parents=True)
    for stem, ids in split.items():
        with gzip.open(sd / f"{stem}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))


def write_binary(root, ei, x, label, split, compressed=True):
    """The layout OGB's DatasetSaver writes for a binary node dataset."""
    (root / "raw").mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    save(root / "raw" / "data.npz", edge_index=ei, node_feat=x, num_nodes_list=np.array([x.shape[0]]),
         num_edges_list=np.array([ei.shape[1]]))
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=label.reshape(-1, 1))
    _write_split(root, split)


def write_text(root, ei, x, label, split):
    (root / "raw").mkdir(parents=True)
    with gzip.open(root / "raw" / "edge.csv.gz", "wt") as f:
        f.write("".join(f"{s},{d}\n" for s, d in ei.T))
    (root / "raw" / "num-node-list.csv").write_text(f"{x.shape[0]}\n")
    (root / "raw" / "node-feat.csv").write_text("".join(",".join(repr(float(v)) for v in r) + "\n" for r in x))
    (root / "raw" / "node-label.csv").write_text("".join(("nan" if np.isnan(v) else str(int(v))) + "\n" for v in label))
    _write_split(root, split)


@pytest.mark.parametrize("compressed", [True, False])
def test_binary_layout_matches_the_text_layout(tmp_path, compressed):
    ei, x, label, split = _data()
    write_binary(tmp_path / "ogbn-bin", ei, x, label, split, compressed=compressed)
    write_text(tmp_path / "ogbn-txt", ei, x, label, split)
    assert format_for(str(tmp_path / "ogbn-bin")).name == "ogb"
    b = load_dataset(str(tmp_path / "ogbn-bin"))
    t = load_ogb(tmp_path / "ogbn-txt")
    assert b.name == "ogbn-bin" and b.num_nodes == 40 and b.num_edges == 300
    for k in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(b, k), getattr(t, k)), k
    # independent check against the raw arrays
    want_y = np.where(np.isnan(label), -1, label).astype(np.int64)
    assert np.array_equal(b.y, want_y) and np.array_equal(b.x, x)
    assert np.array_equal(np.flatnonzero(b.train_mask), np.sort(split["train"]))
    assert sorted(zip(b.indices.tolist(), b.targets().tolist())) == sorted(map(tuple, ei.T.tolist()))
    u = load_ogb(tmp_path / "ogbn-bin", to_undirected=True)
    assert set(zip(u.indices.tolist(), u.targets().tolist())) == (
        set(map(tuple, ei.T.tolist())) | set(map(tuple, ei[::-1].T.tolist())))


def test_binary_layout_without_features_or_labels(tmp_path):
    root = tmp_path / "bare"
    (root / "raw").mkdir(parents=True)
    np.savez(root / "raw" / "data.npz", edge_index=np.array([[0, 1, 4], [1, 2, 0]]),
             num_nodes_list=np.array([6]), num_edges_list=np.array([3]))
    g = load_ogb(root)
    assert g.num_nodes == 6 and g.x is None and g.y is None


def test_binary_layout_errors_name_file_and_field(tmp_path):
    ei, x, label, split = _data()
    root = tmp_path / "o"
    write_binary(root, ei, x, label, split)
    np.savez(root / "raw" / "data.npz", edge_index=ei, node_feat=x, num_nodes_list=np.array([40, 2]))
    with pytest.raises(GraphFormatError, match=r"data.npz: num_nodes_list: expected one graph"):
        load_ogb(root)
    np.savez(root / "raw" / "data.npz", edge_index=ei, num_nodes_list=np.array([40]), num_edges_list=np.array([7]))
    with pytest.raises(GraphFormatError, match=r"data.npz: num_edges_list: says 7 edges but edge_index has 300"):
        load_ogb(root)
    bad = ei.copy()
    bad[1, 5] = 40
    np.savez(root / "raw" / "data.npz", edge_index=bad, num_nodes_list=np.array([40]))
    with pytest.raises(GraphFormatError, match=r"data.npz: edges\[1\]: edges\[1\]\[5\]=40 is out of range"):
        load_ogb(root)
    np.savez(root / "raw" / "data.npz", edge_index=ei, node_feat=x[:39], num_nodes_list=np.array([40]))
    with pytest.raises(GraphFormatError, match=r"data.npz: x: num_nodes_list says 40 nodes but node_feat has 39"):
        load_ogb(root)
    np.savez(root / "raw" / "data.npz", edge_index=ei, num_nodes_list=np.array([40]))
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=label[:30, None])
    with pytest.raises(GraphFormatError, match=r"node-label.npz: y: graph has 40 nodes but node_label has 30"):
        load_ogb(root)
    np.savez_compressed(root / "raw" / "node-label.npz", label=label)
    with pytest.raises(GraphFormatError, match=r"node-label.npz: y: no node_label array"):
        load_ogb(root)
