"""Generators: determinism, sizes, learnability, no self loops (mgg.data.generators)."""
import warnings

import numpy as np
import pytest

from mgg.data import PRESETS, powerlaw, preset, products_like, sbm, to_scipy
from mgg.data.generators import preset_sizes


def _nearest_centroid_acc(g, hops):
    """Mean-aggregate features `hops` times (with self), fit class centroids on train nodes,
    report test accuracy."""
    x = g.x.astype(np.float64)
    A = to_scipy(g, dtype=np.float64)
    d = np.asarray(A.sum(axis=1)).ravel() + 1
    for _ in range(hops):
        x = (A @ x + x) / d[:, None]
    C = g.num_classes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cent = np.stack([x[g.train_mask & (g.y == c)].mean(0) for c in range(C)])
    dist = np.nan_to_num(((x[:, None, :] - cent[None]) ** 2).sum(-1), nan=np.inf)
    pred = dist.argmin(1)
    return float((pred[g.test_mask] == g.y[g.test_mask]).mean())


def _same(a, b):
    for k in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k


def test_sbm_deterministic_and_shapes():
    a, b, c = sbm(seed=3), sbm(seed=3), sbm(seed=4)
    _same(a, b)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert a.num_nodes == 2000 and a.num_classes == 7 and a.x.shape == (2000, 32) and a.x.dtype == np.float32
    assert 0.9 * 2000 * 10 < a.num_edges <= 2000 * 10
    assert np.array_equal(a.reverse().sort_rows().indices, a.sort_rows().indices)  # undirected
    assert not (a.indices == a.targets()).any()  # no self loops
    assert (a.train_mask.sum() + a.val_mask.sum() + a.test_mask.sum()) == 2000
    assert not (a.train_mask & a.test_mask).any()


def test_sbm_is_homophilous_and_learnable():
    g = sbm(seed=1)
    intra = (g.y[g.indices] == g.y[g.targets()]).mean()
    assert intra > 0.5  # p_in_ratio=10, C=7 -> q = 10/16
    chance = 1 / 7
    raw, hop1 = _nearest_centroid_acc(g, 0), _nearest_centroid_acc(g, 1)
    assert raw > chance + 0.2          # features carry the label
    assert hop1 > 0.8 and hop1 > raw + 0.1  # and the graph helps clearly


def test_sbm_ratio_one_is_not_homophilous():
    g = sbm(p_in_ratio=1.0, seed=0)
    assert abs((g.y[g.indices] == g.y[g.targets()]).mean() - 1 / 7) < 0.03


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_sizes_at_small_scale(name):
    p = PRESETS[name]
    scale = {"reddit-like": 2e-3, "products-like": 2e-3, "papers-like": 5e-5}[name]
    g = preset(name, scale=scale, seed=0)
    n, e = preset_sizes(name, scale)
    assert (g.num_nodes, g.num_edges, g.num_features) == (n, e, p.num_features)
    assert n == round(p.num_nodes * scale) and e == round(p.num_edges * scale)
    assert g.indices.dtype == np.int64 and g.x.dtype == np.float32 and g.y.dtype == np.int64
    assert g.num_classes <= p.num_classes
    assert not (g.indices == g.targets()).any()
    assert g.train_mask.any() and g.test_mask.any()


def test_powerlaw_deterministic_heavy_tailed_learnable():
    a = powerlaw(5000, 100_000, 16, 10, seed=7)
    _same(a, powerlaw(5000, 100_000, 16, 10, seed=7))
    assert a.fingerprint() != powerlaw(5000, 100_000, 16, 10, seed=8).fingerprint()
    deg = a.in_degree()
    assert deg.sum() == 100_000 and deg.max() > 10 * deg.mean()  # heavy tail
    assert np.bincount(a.y, minlength=10).min() > 0
    intra = (a.y[a.indices] == a.y[a.targets()]).mean()
    assert intra > 0.7
    dup = 1 - len(np.unique(a.targets() * a.num_nodes + a.indices)) / a.num_edges
    assert dup < 0.1
    assert _nearest_centroid_acc(a, 1) > 0.8 > _nearest_centroid_acc(a, 0) - 0.1


def test_one_million_edges():
    n, e = preset_sizes("products-like", 1e6 / PRESETS["products-like"].num_edges)
    g = products_like(1e6 / PRESETS["products-like"].num_edges, seed=0)
    assert (g.num_nodes, g.num_edges) == (n, e) and abs(e - 1_000_000) <= 1
    assert g.indptr[-1] == e and g.indices.min() >= 0 and g.indices.max() < n


def test_scale_validation():
    with pytest.raises(ValueError):
        preset("products-like", scale=1.5)
    with pytest.raises(ValueError):
        preset("nope")
