"""The first layer from its input's aggregation computed once (mgg.nn.input_cache): the same
logits and gradients as aggregating every step, against float64 references, and used only
where it is exact (no input dropout, an input without gradient)."""
import numpy as np
import pytest
import torch

from mgg.nn import build_model
from mgg.nn.input_cache import InputAggregationCache
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig
from mgg.testing.reference import aggregation_matrix
from mgg.testing.graphs import random_csr

MODELS = [("gcn", {}), ("gin", {"norm": "none"}), ("gin", {"norm": "batch"}), ("sage", {})]


def _dg(n=120, e=700, seed=2):
    indptr, indices = random_csr(n, e, seed=seed)
    return DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(backend="cpu")), indptr, indices


def _step(model, dg, x, y):
    model.zero_grad()
    out = model(x, dg)
    torch.nn.functional.cross_entropy(out, y).backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name,opts", MODELS)
@pytest.mark.parametrize("fin", [5, 30])   # narrower and wider than hidden (both conv orders)
def test_cached_first_layer_equals_aggregating_every_step_float64(name, opts, fin):
    dg, _, _ = _dg()
    torch.manual_seed(0)
    x = torch.randn(dg.n_local, fin, dtype=torch.float64)
    y = torch.randint(0, 4, (dg.n_local,))
    model = build_model(name, fin, 8, 4, 3, 0.0, **opts).double()
    model.cache_input_aggregation = False
    want = [_step(model, dg, x, y) for _ in range(2)]
    assert model.input_cache.builds == 0
    model.cache_input_aggregation = True
    got = [_step(model, dg, x, y) for _ in range(2)]
    assert model.input_cache.builds == 1  # built once, then reused
    for (lo, gr), (wlo, wgr) in zip(got, want):
        torch.testing.assert_close(lo, wlo, rtol=1e-10, atol=1e-12)
        for a, b in zip(gr, wgr):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x, dg), _no_cache(model)(x, dg), rtol=1e-10, atol=1e-12)
    assert model.input_cache.builds == 1
    dg.close()


def _no_cache(model):
    import copy

    m = copy.deepcopy(model)
    m.cache_input_aggregation = False
    return m


def test_one_gcn_layer_from_the_cache_is_the_dense_formula():
    dg, indptr, indices = _dg(seed=7)
    x = torch.randn(dg.n_local, 6, dtype=torch.float64)
    model = build_model("gcn", 6, 16, 3, 1, 0.0).double().eval()
    conv = model.convs[0]
    w = torch.from_numpy(aggregation_matrix(indptr, indices, "gcn").toarray())
    want = w @ x @ conv.lin.weight.T + conv.bias
    torch.testing.assert_close(model(x, dg), want, rtol=1e-5, atol=1e-6)  # the plan's weights are float32
    assert model.input_cache.builds == 1
    dg.close()


@pytest.mark.parametrize("kind", ["gcn", "sum_self", "mean"])
def test_cache_builds_in_column_blocks_and_matches_dense(kind):
    dg, indptr, indices = _dg(seed=3)
    x = torch.randn(dg.n_local, 7, dtype=torch.float64)
    cache = InputAggregationCache()
    got = cache.get(x, dg, kind, chunk=3)   # blocks of 3, 3, 1 columns
    w = torch.from_numpy(aggregation_matrix(indptr, indices, kind).toarray())
    torch.testing.assert_close(got, w @ x, rtol=1e-5, atol=1e-6)  # the plan's weights are float32
    assert cache.get(x, dg, kind, chunk=3) is got and cache.builds == 1
    assert cache.nbytes == x.numel() * 8
    cache.clear()
    assert cache.nbytes == 0
    dg.close()


def test_cache_is_rebuilt_when_the_input_or_graph_changes():
    dg, indptr, indices = _dg(seed=4)
    x = torch.randn(dg.n_local, 5, dtype=torch.float64)
    w = torch.from_numpy(aggregation_matrix(indptr, indices, "gcn").toarray())
    cache = InputAggregationCache()
    cache.get(x, dg, "gcn")
    x.mul_(2.0)   # in place: a new version
    torch.testing.assert_close(cache.get(x, dg, "gcn"), w @ x, rtol=1e-5, atol=1e-6)
    assert cache.builds == 2
    cache.get(x, dg, "sum_self")   # another kind
    assert cache.builds == 3
    cache.get(x.view(x.shape), dg, "sum_self")   # another tensor object (same storage and version)
    assert cache.builds == 4
    cache.get(x, dg, "sum_self")
    assert cache.builds == 5
    dg2, _, _ = _dg(seed=4)   # another DistGraph of the same graph
    cache.get(x, dg2, "sum_self")
    assert cache.builds == 6
    dg.close()
    dg2.close()


def test_cache_unused_with_input_dropout_or_an_input_needing_a_gradient():
    dg, _, _ = _dg(seed=5)
    x = torch.randn(dg.n_local, 6)
    model = build_model("gcn", 6, 8, 3, 2, 0.5)
    gen = torch.Generator().manual_seed(0)
    model.train()
    model(x, dg, gen).sum().backward()
    assert model.input_cache.builds == 0          # training with input dropout: aggregated per step
    model.eval()
    with torch.no_grad():
        model(x, dg)
    assert model.input_cache.builds == 1          # evaluation: no dropout, cached
    xg = x.clone().requires_grad_(True)
    out = model(xg, dg)
    out.sum().backward()
    assert model.input_cache.builds == 1 and xg.grad is not None and torch.isfinite(xg.grad).all()
    dg.close()


def test_a_model_with_a_cache_pickles_without_it():
    import io

    dg, _, _ = _dg(seed=8)
    x = torch.randn(dg.n_local, 6)
    model = build_model("gcn", 6, 8, 3, 2, 0.0).eval()
    with torch.no_grad():
        want = model(x, dg)
    assert model.input_cache.nbytes > 0
    buf = io.BytesIO()
    torch.save(model, buf)   # the whole module: weak references and the cached rows are not saved
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back.input_cache.nbytes == 0
    with torch.no_grad():
        torch.testing.assert_close(back(x, dg), want)
    assert back.input_cache.builds == 2   # the count came along; the rows were rebuilt
    dg.close()


def test_gat_has_no_input_aggregation():
    dg, _, _ = _dg(seed=6)
    x = torch.randn(dg.n_local, 6)
    model = build_model("gat", 6, 4, 3, 2, 0.0).eval()
    with torch.no_grad():
        model(x, dg)
    assert model.input_cache.builds == 0
    dg.close()


def test_rows_from_the_cache_equal_the_full_forward():
    indptr, indices = random_csr(200, 1200, seed=9)
    rows = np.sort(np.random.default_rng(1).choice(200, 30, replace=False))
    torch.manual_seed(1)
    x = torch.randn(200, 10, dtype=torch.float64)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        rs = dg.register_rows("r", torch.from_numpy(rows))
        for layers in (1, 2):
            model = build_model("gcn", 10, 8, 4, layers, 0.0).double().eval()
            with torch.no_grad():
                full = _no_cache(model)(x, dg)[torch.from_numpy(rows)]
                got = model(x, dg, rows=rs)
            assert model.input_cache.builds == 1
            torch.testing.assert_close(got, full, rtol=1e-10, atol=1e-12)


def test_gin_trains_from_the_cache_with_dropout_between_layers():
    """GIN drops out between layers only: with dropout 0.5 its first layer still starts from the
    cached aggregation in training, with the logits and gradients of aggregating every step (the
    same dropout masks: the generator draws one seed per hidden layer either way)."""
    dg, _, _ = _dg(seed=6)
    torch.manual_seed(0)
    x = torch.randn(dg.n_local, 9, dtype=torch.float64)
    y = torch.randint(0, 4, (dg.n_local,))
    model = build_model("gin", 9, 8, 4, 3, 0.5, norm="batch").double()
    results = []
    for cached in (False, True):
        model.cache_input_aggregation = cached
        gen = torch.Generator().manual_seed(11)
        model.zero_grad()
        out = model(x, dg, gen)
        torch.nn.functional.cross_entropy(out, y).backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    assert model.input_cache.builds == 1
    (a, ga), (b, gb) = results
    assert not torch.equal(a, model.eval()(x, dg))  # dropout was active in training
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    for u, v in zip(gb, ga):
        torch.testing.assert_close(u, v, rtol=1e-9, atol=1e-12)
    dg.close()
