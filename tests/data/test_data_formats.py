"""The dataset-format table behind load_dataset: built-in entries, messages, adding a format."""
import numpy as np
import pytest

from mgg.data import Graph, GraphFormatError, load_dataset, save_npz
from mgg.data.formats import FORMATS, DatasetFormat, expected_formats, format_for, register_format


def test_builtin_formats_and_what_they_carry():
    table = {f.name: f for f in FORMATS}
    assert list(table)[:3] == ["npz", "edgelist", "ogb"]
    assert (table["npz"].labels, table["npz"].features) == (True, True)
    assert (table["edgelist"].labels, table["edgelist"].features) == (False, False)
    assert table["ogb"].folder and table["ogb"].labels


def test_recognition_by_suffix_gz_and_folder(tmp_path):
    for name, fmt in [("g.NPZ", "npz"), ("g.txt.gz", "edgelist"), ("g.csv", "edgelist")]:
        (tmp_path / name).write_bytes(b"")
        assert format_for(str(tmp_path / name)).name == fmt, name
    (tmp_path / "g.bin").write_bytes(b"")
    assert format_for(str(tmp_path / "g.bin")) is None
    (tmp_path / "ds" / "raw").mkdir(parents=True)
    assert format_for(str(tmp_path / "ds")) is None
    (tmp_path / "ds" / "raw" / "edge.csv").write_text("0,1\n")
    assert format_for(str(tmp_path / "ds")).name == "ogb"


def test_messages_unchanged(tmp_path):
    (tmp_path / "g.bin").write_bytes(b"x")
    with pytest.raises(ValueError) as e:
        load_dataset(tmp_path / "g.bin")
    assert str(e.value) == (f"unsupported file type {str(tmp_path / 'g.bin')!r}: expected .npz, an edge list "
                            "(.txt, .edges, .el, .csv) or an ogbn-style folder")
    with pytest.raises(GraphFormatError, match=r"folder is not an ogbn-style dataset \(no raw/edge.csv\[.gz\] or raw/data.npz\)"):
        load_dataset(tmp_path)
    assert expected_formats(folder=True) == "an ogbn-style folder"


def test_a_new_format_is_one_registration(tmp_path):
    """A format recognised by a probe (magic bytes), registered once, is loadable by load_dataset."""
    def probe(path):
        with open(path, "rb") as f:
            return f.read(4) == b"MYG1"

    def load(path):
        n = int(open(path, "rb").read()[4:])
        return Graph(indptr=np.arange(n + 1, dtype=np.int64), indices=np.roll(np.arange(n, dtype=np.int64), 1))

    fmt = register_format(DatasetFormat("myg", load, "a MYG1 file", probe=probe))
    try:
        (tmp_path / "ring.dat").write_bytes(b"MYG15")
        g = load_dataset(tmp_path / "ring.dat")
        assert g.num_nodes == 5 and g.num_edges == 5
        assert expected_formats().endswith("an ogbn-style folder or a MYG1 file")
        with pytest.raises(ValueError, match="already registered"):
            register_format(fmt)
    finally:
        FORMATS.remove(fmt)
    save_npz(g, tmp_path / "ring.npz")  # the built-ins still work after removal
    assert load_dataset(tmp_path / "ring.npz").num_edges == 5


def test_format_needs_a_way_to_be_recognised():
    with pytest.raises(ValueError, match="needs suffixes or a probe"):
        DatasetFormat("x", lambda p: None, "x")
    with pytest.raises(ValueError, match="folder format needs a probe"):
        DatasetFormat("x", lambda p: None, "x", suffixes=(".x",), folder=True)
