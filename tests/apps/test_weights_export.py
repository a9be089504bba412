"""Weights leave mgg as a plain torch.load-able (or safetensors) state dict under PyTorch
Geometric's names: loaded into PyG's GCN / GraphSAGE / GAT / GIN they give mgg's outputs, read
back they give mgg's weights exactly; mgg.predict writes per-node predictions in the user's ids."""
import importlib.util
import json

import pytest
import torch

from mgg.apps.weights_file import WeightsError, read_weights, write_weights
from mgg.data import load_dataset
from mgg.nn import build_model
from mgg.graph import DistGraph, RuntimeConfig
from mgg.runtime.comm import Communicator

HAVE_PYG = importlib.util.find_spec("torch_geometric") is not None
HAVE_SAFETENSORS = importlib.util.find_spec("safetensors") is not None
CASES = [("gcn", {}), ("sage", {}), ("gat", {}), ("gin", {"norm": "batch"}), ("gin", {"norm": "none"}),
         ("gin", {"norm": "layer"})]


@pytest.fixture(scope="module")
def graph():
    return load_dataset("sbm", scale=0.02)  # 200 nodes, features, 7 classes


def _trained_model(name, opts, g, dg):
    """A model whose weights and running statistics are away from their initial values."""
    torch.manual_seed(3)
    m = build_model(name, g.num_features, 8, g.num_classes, 3 if name != "gat" else 2, 0.0, **opts)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        m.train()
        m(torch.from_numpy(g.x), dg)  # batch norms update their running statistics
    return m.eval()


def _config(m, name, opts):
    return {"hidden": 8, "layers": len(m.convs), "dropout": 0.0, "norm": opts.get("norm")}


@pytest.mark.parametrize("name,opts", CASES)
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_weights_file_reads_back_exactly(tmp_path, graph, name, opts, suffix):
    if suffix == ".safetensors" and not HAVE_SAFETENSORS:
        pytest.skip("safetensors is not installed")
    with DistGraph(graph.indptr, graph.indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        m = _trained_model(name, opts, graph, dg)
        path = str(tmp_path / f"w{suffix}")
        desc = write_weights(path, name, m.state_dict(), _config(m, name, opts))
        if suffix == ".pt":  # plain torch.load: a dict of tensors, nothing else
            plain = torch.load(path, weights_only=True)
            assert isinstance(plain, dict) and all(isinstance(v, torch.Tensor) for v in plain.values())
            assert json.load(open(path + ".json"))["model"] == name
        sd, back = read_weights(path)
        assert back["num_features"] == graph.num_features and back["num_classes"] == graph.num_classes
        want = m.state_dict()
        assert set(sd) == set(want)
        for k in want:
            torch.testing.assert_close(sd[k], want[k], rtol=0, atol=1e-6 if "running_mean" in k else 0)
        assert desc["pyg"]["class"] in ("GCN", "GraphSAGE", "GAT", "GIN")


@pytest.mark.skipif(not HAVE_PYG, reason="torch_geometric is not installed")
@pytest.mark.parametrize("name,opts", CASES)
def test_pyg_models_load_the_weights_and_give_the_same_outputs(tmp_path, graph, name, opts):
    import torch_geometric.nn.models as pyg_models
    from torch_geometric.nn import GATConv

    with DistGraph(graph.indptr, graph.indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        m = _trained_model(name, opts, graph, dg).double()
        x = torch.from_numpy(graph.x).double()
        want = m(x, dg)
    path = str(tmp_path / "w.pt")
    desc = write_weights(path, name, m.state_dict(), _config(m, name, opts))
    spec = desc["pyg"]
    pyg = getattr(pyg_models, spec["class"])(**spec["kwargs"])
    if name == "gat":  # the one change the description names: one averaged head in the last layer
        pyg.convs[-1] = GATConv(pyg.convs[-1].in_channels, graph.num_classes, heads=1, concat=False)
    pyg.load_state_dict(torch.load(path, weights_only=True), strict=True)
    pyg = pyg.double().eval()
    got = pyg(x, torch.from_numpy(graph.edge_index()))
    # float64 models; the graph's gcn normalisation is float32 (about 1e-7 relative)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not HAVE_PYG, reason="torch_geometric is not installed")
def test_pyg_trained_gin_weights_import_with_their_first_bias(graph):
    """PyG's GIN has a bias before each MLP batch norm; imported, it folds into the running mean."""
    from torch_geometric.nn.models import GIN as PygGIN

    from mgg.nn.pyg_keys import from_pyg

    torch.manual_seed(5)
    pyg = PygGIN(graph.num_features, 8, 3, graph.num_classes, norm="batch_norm").double()
    with torch.no_grad():
        for p in pyg.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for mod in pyg.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.normal_()
                mod.running_var.uniform_(0.5, 2.0)
    pyg.eval()
    m = build_model("gin", graph.num_features, 8, graph.num_classes, 3, 0.0, norm="batch").double()
    m.load_state_dict(from_pyg("gin", pyg.state_dict(), "batch"), strict=True)
    x = torch.from_numpy(graph.x).double()
    with DistGraph(graph.indptr, graph.indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        got = m.eval()(x, dg)
    torch.testing.assert_close(got, pyg(x, torch.from_numpy(graph.edge_index())), rtol=1e-9, atol=1e-9)


def test_bad_weights_files_are_one_line(tmp_path):
    p = tmp_path / "w.pt"
    with pytest.raises(WeightsError, match="file not found"):
        read_weights(str(p))
    torch.save({"a": torch.zeros(1)}, p)
    with pytest.raises(WeightsError, match=r"w.pt.json is missing"):
        read_weights(str(p))
    p.write_bytes(b"junk")
    (tmp_path / "w.pt.json").write_text('{"format": "mgg-weights", "model": "gcn"}')
    with pytest.raises(WeightsError, match="cannot read"):
        read_weights(str(p))
