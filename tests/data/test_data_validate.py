"""validate_graph: every error path raises GraphFormatError naming source, field and problem."""
import numpy as np
import pytest

from mgg.data import Graph, GraphFormatError, validate_graph

SRC = "some/file.npz"


def _g(**kw):
    base = dict(indptr=np.array([0, 1, 3, 4]), indices=np.array([1, 0, 2, 1]), name="t")
    base.update(kw)
    return Graph(**base)


def _err(g, field, *fragments):
    with pytest.raises(GraphFormatError) as ei:
        validate_graph(g, SRC)
    msg = str(ei.value)
    assert SRC in msg and field in msg, msg
    assert ei.value.field == field and ei.value.source == SRC
    for f in fragments:
        assert f in msg, msg
    return msg


def test_valid_graph_converts_losslessly():
    g = _g(indptr=np.array([0, 1, 3, 4], dtype=np.int32), indices=np.array([1, 0, 2, 1], dtype=np.uint16),
           x=np.ones((3, 2), dtype=np.float64), y=np.array([0, 1, -1], dtype=np.int32),
           train_mask=np.array([1, 0, 0], dtype=np.uint8))
    v = validate_graph(g, SRC)
    assert v.indptr.dtype == np.int64 and v.indices.dtype == np.int64
    assert v.x.dtype == np.float32 and v.y.dtype == np.int64 and v.train_mask.dtype == bool


def test_negative_id():
    _err(_g(indices=np.array([1, 0, -3, 1])), "indices", "indices[2]=-3 is negative")


def test_id_too_large():
    _err(_g(indices=np.array([1, 0, 3, 1])), "indices", "indices[2]=3", "out of range")


def test_non_monotone_indptr():
    _err(_g(indptr=np.array([0, 3, 1, 4])), "indptr", "not monotone at position 2")


def test_indptr_first_and_last():
    _err(_g(indptr=np.array([1, 1, 3, 4])), "indptr", "indptr[0]=1")
    _err(_g(indptr=np.array([0, 1, 3, 5])), "indptr", "indptr[-1]=5")


def test_float_indices_rejected():
    _err(_g(indices=np.array([1.0, 0.0, 2.0, 1.0])), "indices", "float64", "not an integer")


def test_nan_and_inf_x():
    x = np.zeros((3, 2), dtype=np.float32)
    x[2, 1] = np.nan
    _err(_g(x=x), "x", "NaN at row 2")
    x[2, 1] = np.inf
    _err(_g(x=x), "x", "inf at row 2")


def test_x_row_mismatch():
    _err(_g(x=np.zeros((4, 2), dtype=np.float32)), "x", "indptr has 4 entries", "x has 4 rows")


def test_y_problems():
    _err(_g(y=np.array([0, 1])), "y", "y has 2 entries")
    _err(_g(y=np.array([0, -2, 1])), "y", "y[1]=-2")
    _err(_g(y=np.array([0.0, 1.0, 1.0])), "y", "not an integer")


def test_mask_problems():
    _err(_g(train_mask=np.array([True, False])), "train_mask", "shape")
    _err(_g(val_mask=np.array([0.5, 0, 0])), "val_mask", "not bool")
    _err(_g(y=np.array([0, -1, 1]), test_mask=np.array([False, True, False])), "test_mask", "unlabelled")


def test_empty_graph():
    _err(_g(indptr=np.array([0]), indices=np.array([], dtype=np.int64)), "indptr", "empty graph")
    _err(_g(indptr=np.array([], dtype=np.int64), indices=np.array([], dtype=np.int64)), "indptr", "empty graph")


def test_error_is_value_error_and_default_source_is_name():
    with pytest.raises(ValueError) as ei:
        validate_graph(_g(indices=np.array([1, 0, -1, 1]), name="<generator sbm>"))
    assert "<generator sbm>" in str(ei.value)


def test_large_graph_validates_quickly():
    n, e = 200_000, 5_000_000
    rng = np.random.default_rng(0)
    indptr = np.linspace(0, e, n + 1).astype(np.int64)
    g = validate_graph(Graph(indptr, rng.integers(0, n, e)), SRC)
    assert g.num_edges == e
