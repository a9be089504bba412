"""Single-process executor tests (P = 1) against the float64 scipy reference."""
import numpy as np
import pytest
import torch

from mgg.testing.reference import aggregate_reference
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig
from mgg.testing.graphs import random_csr


def rel_err(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("ps,dist,wpb", [(1, 1, 1), (4, 2, 2), (32, 16, 8)])
def test_single_rank_matches_reference(kind, transposed, ps, dist, wpb):
    indptr, indices = random_csr(300, 2500, seed=ps * 7 + dist)
    x = np.random.default_rng(3).standard_normal((300, 5)).astype(np.float32)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(ps, dist, wpb, backend="cpu")) as dg:
        out = dg.aggregate(torch.from_numpy(x), kind, transposed).numpy()
    ref = aggregate_reference(indptr, indices, x, kind, transposed)
    assert rel_err(out, ref) < 1e-5


def test_partitioned_aggregator_matches_edge_sums_in_float64():
    """PartitionedAggregator (one sparse CSR product of the plan's edges) against the sum over
    the plan's edges, partition by partition, in float64; a graph with repeated edges; a 16-bit
    table read as its 16-bit values; no partitions at all."""
    from mgg.kernels.cpu import PartitionedAggregator

    indptr, indices = random_csr(100, 3000, seed=5)  # 3000 edges on 100 nodes: repeats
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(3, 1, 1, backend="cpu")) as dg:
        p = dg.plan("gcn")
    x = torch.randn(100, 4)
    ref = np.zeros((100, 4))
    for t, a, b in p.local_parts:
        for e in range(a, b):
            ref[t] += float(p.local_weight[e]) * x[p.local_indices[e]].double().numpy()
    agg = PartitionedAggregator(p.local_parts, p.local_indices, p.local_weight)
    out = torch.full((100, 4), 0.5)
    agg.add_into(out, x)
    np.testing.assert_allclose(out.numpy(), ref + 0.5, rtol=1e-5, atol=1e-5)
    # held per edge: the plan's own arrays and the matrix, whose indices are int32
    assert np.shares_memory(agg.sources, p.local_indices) and np.shares_memory(agg.weight, p.local_weight)
    assert [k for k, v in vars(agg).items() if isinstance(v, np.ndarray) and not any(
        np.shares_memory(v, a) for a in (p.local_parts, p.local_indices, p.local_weight))] == []
    m = agg.matrix(100, 100)
    assert m.col_indices().dtype == torch.int32 and m.crow_indices().dtype == torch.int32
    out64 = torch.zeros((100, 4), dtype=torch.float64)
    agg.add_into(out64, x.double())
    np.testing.assert_allclose(out64.numpy(), ref, rtol=1e-6, atol=1e-6)  # repeats summed in float32
    half = x.to(torch.bfloat16)
    ref16 = np.zeros((100, 4))
    for t, a, b in p.local_parts:
        for e in range(a, b):
            ref16[t] += float(p.local_weight[e]) * half[p.local_indices[e]].double().numpy()
    out16 = torch.zeros(100, 4)
    agg.add_into(out16, half)
    np.testing.assert_allclose(out16.numpy(), ref16, rtol=1e-5, atol=1e-5)
    empty = PartitionedAggregator(np.zeros((0, 3), np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    z = torch.zeros(100, 4)
    empty.add_into(z, x)
    assert not z.any()


def test_set_params_keeps_results():
    indptr, indices = random_csr(200, 1500, seed=9)
    x = torch.randn(200, 3)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(2, 1, 1, backend="cpu")) as dg:
        a = dg.aggregate(x, "gcn")
        from mgg.runtime import PlanParams

        dg.set_params(PlanParams(16, 4, 4))
        assert dg.plan("gcn").ps == 16
        b = dg.aggregate(x, "gcn")
    assert torch.allclose(a, b, atol=1e-5)


def test_bad_shapes_and_kinds():
    indptr, indices = random_csr(20, 50, seed=1)
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        with pytest.raises(ValueError, match="shape"):
            dg.aggregate(torch.zeros(19, 2), "sum")
        with pytest.raises(ValueError, match="unknown aggregation kind"):
            dg.aggregate(torch.zeros(20, 2), "max")
    with pytest.raises(ValueError, match="backend"):
        RuntimeConfig(backend="tpu")


def test_reweighted_plans_equal_freshly_built_ones():
    indptr, indices = random_csr(150, 1200, seed=21)
    cfg = RuntimeConfig(3, 2, 2, backend="cpu")
    for transposed in (False, True):
        with DistGraph(indptr, indices, Communicator(), cfg) as a:
            a.plan("sum", transposed)
            derived = {k: a.plan(k, transposed) for k in ("mean", "gcn")}
        for kind, p in derived.items():
            with DistGraph(indptr, indices, Communicator(), cfg) as b:
                q = b.plan(kind, transposed)
            for f in ("local_weight", "remote_weight", "self_weight"):
                assert np.allclose(getattr(p, f), getattr(q, f), rtol=1e-6), (kind, transposed, f)
            assert p.has_self == q.has_self
