"""The bench harness's dataset specs "name[:scale[:order]]": the order relabels the generated
graph once (mgg.data.reorder) and names the rows, and the cached files of two orders differ."""
import types

import numpy as np
import pytest

from bench.harness.workloads import load_graph, parse_dataset
from mgg.data import load_dataset
from mgg.data.reorder import reorder_nodes


@pytest.mark.parametrize("spec,want", [("reddit-like", ("reddit-like", 1.0, "none")),
                                       ("products-like:0.5", ("products-like", 0.5, "none")),
                                       ("products-like:1:cluster", ("products-like", 1.0, "cluster"))])
def test_parse_dataset(spec, want):
    assert parse_dataset(spec) == want


def test_an_order_relabels_once_and_names_the_graph(tmp_path):
    comm = types.SimpleNamespace(rank=0, barrier=lambda: None)
    plain = load_graph("sbm", 0.02, str(tmp_path), comm)
    ordered = load_graph("sbm", 0.02, str(tmp_path), comm, "degree")
    assert plain.name == "sbm" and ordered.name == "sbm+degree"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sbm-0.02-degree.npz", "sbm-0.02.npz"]
    want, _ = reorder_nodes(load_dataset("sbm", scale=0.02, seed=0), "degree")
    np.testing.assert_array_equal(ordered.indptr, want.indptr)
    np.testing.assert_array_equal(ordered.indices, want.indices)
    assert not np.array_equal(plain.indices, ordered.indices)


def test_model_specs_name_the_norm_and_the_unfused_form():
    from bench.harness.workloads import build_bench_model, model_spec
    from mgg.nn.norm import DistBatchNorm

    assert model_spec("gin")["options"] == {"norm": "batch"} and not model_spec("gin")["unfused"]
    cub = model_spec("gin+cublas")
    assert cub["cublas"] and cub["mgg_only"] and not cub["unfused"] and cub["options"] == {"norm": "batch"}
    assert not model_spec("gin")["mgg_only"]
    spec = model_spec("gin:none+unfused")
    assert spec["options"] == {"norm": "none"} and spec["unfused"]
    g = load_dataset("sbm", scale=0.02, seed=0)
    for name, fused in (("gin", True), ("gin+unfused", False)):
        norms = [m for m in build_bench_model(name, g, "cpu").modules() if isinstance(m, DistBatchNorm)]
        assert norms and all(m.fuse_relu is fused for m in norms)
    with pytest.raises(SystemExit, match="only gin takes a norm"):
        model_spec("gcn:batch")
