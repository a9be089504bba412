"""--undirected: mgg.train and mgg.prepare symmetrise a graph stored directed (ogbn-arxiv style)
as they load it; the result is the union of both directions, duplicates removed."""
import numpy as np
import pytest

from mgg.apps.args import parse_args
from mgg.apps.cli import load
from mgg.apps.prepare_cli import main as prepare_main
from mgg.data import load_dataset, load_npz
from mgg.runtime.comm import Communicator

EDGES = np.array([[0, 1], [1, 2], [2, 0], [0, 1], [3, 3], [4, 2]])  # a duplicate and a self loop


def _pairs(g):
    return set(zip(g.indices.tolist(), g.targets().tolist()))


def _want():
    both = {(int(s), int(d)) for s, d in EDGES} | {(int(d), int(s)) for s, d in EDGES}
    return both


@pytest.fixture
def directed(tmp_path):
    p = tmp_path / "directed.npz"  # PyG layout: edge_index [2, E] with labels and features
    rng = np.random.default_rng(0)
    np.savez(p, edge_index=EDGES.T.copy(), y=np.array([0, 1, 0, 1, 0]),
             x=rng.standard_normal((5, 3)).astype(np.float32), train_mask=np.ones(5, bool))
    return p


def test_train_flag_symmetrises_the_loaded_graph(directed):
    comm = Communicator(comm=None)
    plain, _ = load(parse_args(["--dataset", str(directed)]), comm)
    assert plain.num_edges == len(EDGES)
    cfg = parse_args(["--dataset", str(directed), "--undirected"])
    assert cfg.undirected
    g, prep = load(cfg, comm)
    assert _pairs(g) == _want() and g.num_edges == len(_want())
    assert prep is not None


def test_csr_file_is_symmetrised_in_memory(tmp_path, directed):
    out = tmp_path / "csr.npz"
    assert prepare_main([str(directed), "--out", str(out)]) == 0
    assert load_dataset(str(out)).mapped
    g = load_dataset(str(out), to_undirected=True)
    assert not g.mapped and _pairs(g) == _want()


def test_prepare_writes_the_symmetrised_graph(tmp_path, directed, capsys):
    out = tmp_path / "u.npz"
    assert prepare_main([str(directed), "--out", str(out), "--undirected"]) == 0
    assert "symmetrising" in capsys.readouterr().out
    assert _pairs(load_npz(out)) == _want()


def test_generated_graphs_take_the_flag():
    g = load_dataset("reddit-like", scale=0.002, to_undirected=True)
    t = g.targets()
    assert set(zip(g.indices.tolist(), t.tolist())) == set(zip(t.tolist(), g.indices.tolist()))
