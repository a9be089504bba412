"""DistGraph's plan path (rows, weights, plans and reweighted plans, built with torch ops on the
plan device) against an independent numpy construction: every plan of every kind, forward and
transposed, whichever kind is built first, must be bit-identical. The GPU test compares a plan
built on CUDA with the CPU-built one (skipped without a GPU)."""
import dataclasses

import numpy as np
import pytest
import torch

from mgg.graph import DistGraph, RuntimeConfig
from mgg.runtime.partition import partition_ranges
from mgg.runtime.plan import PlanParams, build_plan, cut_partitions, cut_remote, warp_worklist
from mgg.runtime.weights import diag_weights, pair_weights, pair_weights_by_row
from mgg.testing.graphs import random_csr
from mgg.testing.plan_reference import plan_test_graphs, reference_split, reference_transposed


class _FakeComm:
    """The attributes DistGraph reads from a communicator, for rank `rank` of `size`."""

    def __init__(self, rank: int, size: int, nodes: np.ndarray | None = None):
        self.rank, self.size, self.local_rank = rank, size, rank
        self._nodes = np.zeros(size, np.int32) if nodes is None else nodes.astype(np.int32)

    def node_of_ranks(self) -> np.ndarray:
        return self._nodes


def _np_pair(kind, deg, target, source):
    """The former numpy weights (independent of mgg.runtime.weights)."""
    if kind == "sum":
        return np.ones(len(target), np.float32)
    if kind == "mean":
        return (1.0 / np.maximum(deg[target], 1)).astype(np.float32)
    dinv = 1.0 / np.sqrt(deg.astype(np.float64) + 1.0)
    return (dinv[target] * dinv[source]).astype(np.float32)


def _reference_plan(indptr, indices, b, r, kind, transposed, nop, params):
    lo, hi = int(b[r]), int(b[r + 1])
    deg = np.diff(indptr)
    if transposed:
        ip, other, row = reference_transposed(indptr, indices, lo, hi)
        w = _np_pair(kind, deg, other, row)
    else:
        a, e = indptr[lo], indptr[hi]
        ip, other = indptr[lo: hi + 1] - a, indices[a:e]
        row = lo + np.repeat(np.arange(hi - lo), np.diff(ip))
        other = other[np.lexsort((other, row))]  # DistGraph sorts every forward row's entries
        w = _np_pair(kind, deg, row, other)
    ref = reference_split(ip, other, w, b, r, nop)
    ref["local_parts"] = cut_partitions(ref["local_indptr"], params.ps)
    ref["remote_parts"], ref["remote_part_inter"] = cut_remote(ref["remote_indptr"], ref["remote_split"],
                                                               params.ps, params.inter_ps)
    ref["warps"] = warp_worklist(len(ref["local_parts"]), len(ref["remote_parts"]), params.dist)
    ref["self_weight"] = ((1.0 / (deg[lo:hi].astype(np.float64) + 1.0)).astype(np.float32) if kind == "gcn"
                          else np.zeros(hi - lo, np.float32))
    return ref


def _assert_plan(plan, ref, tag):
    for k, v in ref.items():
        got = getattr(plan, k)
        assert got.dtype == v.dtype and np.array_equal(got, v), (k, tag)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("first", ["gcn", "mean", "sum"])
def test_distgraph_plans_match_reference(world, first):
    params = PlanParams(3, 2, 2, 2)
    kinds = [first] + [k for k in ("sum", "mean", "gcn") if k != first]
    for gi, (indptr, indices) in enumerate(plan_test_graphs()):
        if gi % 2 and world > 1:
            continue  # keep the test short: half the graphs at P > 1
        nodes = np.arange(world) // 2
        b = partition_ranges(indptr, world)
        for r in range(world):
            cfg = RuntimeConfig(params.ps, params.dist, params.wpb, backend="cpu", ps_inter=params.ps_inter)
            dg = DistGraph(indptr, indices, _FakeComm(r, world, nodes), cfg, store=object())
            assert np.array_equal(dg.bounds, b)
            for transposed in (False, True):
                for kind in kinds:
                    ref = _reference_plan(indptr, indices, b, r, kind, transposed, nodes.astype(np.int32), params)
                    _assert_plan(dg.plan(kind, transposed), ref, (gi, world, r, kind, transposed))


def test_partition_beta_reaches_partition_ranges():
    indptr, indices = random_csr(300, 5000, 4)
    ind = np.sort(indices)  # skew the sources; targets keep their degrees
    for beta in (None, 0.0, 5.0):
        dg = DistGraph(indptr, ind, _FakeComm(0, 4), RuntimeConfig(backend="cpu", partition_beta=beta),
                       store=object())
        assert np.array_equal(dg.bounds, partition_ranges(indptr, 4, beta=beta))


def test_weights_torch_equal_numpy():
    rng = np.random.default_rng(0)
    deg = rng.integers(0, 10 ** 6, size=5000)
    deg[:10] = 0
    t, s = rng.integers(0, 5000, size=(2, 40000))
    for kind in ("sum", "mean", "gcn"):
        want = _np_pair(kind, deg, t, s)
        got = pair_weights(kind, torch.from_numpy(deg), torch.from_numpy(t), torch.from_numpy(s))
        assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want), kind
        assert np.array_equal(pair_weights(kind, deg, t, s), want), kind
    # by row: rows [lo, lo + n) with CSR counts
    lo, n = 100, 300
    counts = rng.integers(0, 7, size=n)
    ip = np.concatenate([[0], np.cumsum(counts)])
    other = rng.integers(0, 5000, size=int(ip[-1]))
    row = lo + np.repeat(np.arange(n), counts)
    for kind in ("sum", "mean", "gcn"):
        for fwd in (True, False):
            want = _np_pair(kind, deg, row, other) if fwd else _np_pair(kind, deg, other, row)
            got = pair_weights_by_row(kind, torch.from_numpy(deg), torch.from_numpy(ip), lo,
                                      torch.from_numpy(other), row_is_target=fwd)
            assert np.array_equal(got.numpy(), want), (kind, fwd)
    d = diag_weights("gcn", deg, np.arange(50))
    assert np.array_equal(diag_weights("gcn", torch.from_numpy(deg), torch.arange(50)).numpy(), d)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("world", [1, 2, 4])
def test_cuda_plans_equal_cpu_plans(world):
    indptr, indices = random_csr(3000, 60000, 11)
    nodes = np.arange(world) // 2
    for r in range(world):
        plans = {}
        for backend in ("cpu", "gpu"):
            cfg = RuntimeConfig(4, 2, 2, backend=backend, ps_inter=3)
            dg = DistGraph(indptr, indices, _FakeComm(r, world, nodes), cfg, store=object())
            assert dg.plan_device.type == ("cuda" if backend == "gpu" else "cpu")
            plans[backend] = {(k, t): dg.plan(k, t) for t in (False, True) for k in ("gcn", "sum", "mean")}
        for key, p in plans["cpu"].items():
            q = plans["gpu"][key]
            for f in dataclasses.fields(p):
                a, c = np.asarray(getattr(p, f.name)), np.asarray(getattr(q, f.name))
                assert a.dtype == c.dtype and np.array_equal(a, c), (f.name, key, r)
    # build_plan alone, numpy inputs, device="cuda"
    b = partition_ranges(indptr, 2)
    rip, ind = indptr[: b[1] + 1], indices[: indptr[b[1]]]
    w = (np.arange(len(ind)) % 13).astype(np.float32)
    p = build_plan(rip, ind, w, None, b, 0, PlanParams(5, 3, 2, 2), nodes[:2] if world >= 2 else None)
    q = build_plan(rip, ind, w, None, b, 0, PlanParams(5, 3, 2, 2), nodes[:2] if world >= 2 else None,
                   device="cuda")
    for f in dataclasses.fields(p):
        assert np.array_equal(np.asarray(getattr(p, f.name)), np.asarray(getattr(q, f.name))), f.name


def test_weights_by_row_in_threaded_blocks():
    """Host weights over several row blocks and threads equal the per-entry formula."""
    rng = np.random.default_rng(1)
    n, lo = 40000, 7
    deg = rng.integers(0, 500, size=n + lo)
    counts = rng.integers(0, 150, size=n)
    counts[:5] = 0
    ip = np.concatenate([[0], np.cumsum(counts)])
    other = rng.integers(0, n + lo, size=int(ip[-1]))
    row = lo + np.repeat(np.arange(n), counts)
    t = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for kind in ("mean", "gcn"):
            for fwd in (True, False):
                want = _np_pair(kind, deg, row, other) if fwd else _np_pair(kind, deg, other, row)
                got = pair_weights_by_row(kind, torch.from_numpy(deg), torch.from_numpy(ip), lo,
                                          torch.from_numpy(other), row_is_target=fwd)
                assert np.array_equal(got.numpy(), want), (kind, fwd)
    finally:
        torch.set_num_threads(t)
