"""DistGraphs for tests: a small random graph on one process, the CPU plans of a graph, and one
GCN aggregation (forward and backward) through the CPU and the GPU backend."""
from __future__ import annotations

import numpy as np

from ..graph import DistGraph, RuntimeConfig
from ..runtime import Communicator
from .graphs import random_csr

__all__ = ["single_rank_graph", "cpu_plans", "gcn_on_cpu_and_gpu"]


def single_rank_graph(n: int = 40, e: int = 160, seed: int = 0, ps: int = 4):
    """(DistGraph on one process with the CPU backend (ps, dist=2, wpb=2), indptr, indices) of
    random_csr(n, e, seed)."""
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(ps=ps, dist=2, wpb=2, backend="cpu"))
    return dg, indptr, indices


def cpu_plans(indptr: np.ndarray, indices: np.ndarray, kind: str) -> dict:
    """{transposed: AggregationPlan} of aggregation `kind`, forward (False) and transposed (True),
    built by a one-process CPU DistGraph with the default configuration."""
    with DistGraph(indptr, indices, Communicator(), RuntimeConfig(backend="cpu")) as dg:
        return {False: dg.plan(kind, False), True: dg.plan(kind, True)}


def gcn_on_cpu_and_gpu(comm, indptr, indices, x, g, **config):
    """Differentiable GCN aggregation of x (float32 [N, D], the whole graph's rows) and its backward
    with output gradient g (float32 [N, D]) through the CPU and the GPU backend
    (RuntimeConfig(8, 4, 4, **config)): ({backend: (out, grad_x)}, lo, hi), numpy arrays of this
    rank's rows [lo, hi)."""
    import torch

    from ..nn import aggregate

    res = {}
    for backend in ("cpu", "gpu"):
        with DistGraph(indptr, indices, comm, RuntimeConfig(8, 4, 4, backend=backend, **config)) as dg:
            xl = torch.from_numpy(dg.local(x).copy()).to(dg.device).requires_grad_(True)
            out = aggregate(xl, dg, "gcn")
            (out * torch.from_numpy(dg.local(g).copy()).to(dg.device)).sum().backward()
            res[backend] = (out.detach().cpu().numpy(), xl.grad.cpu().numpy())
            lo, hi = dg.lo, dg.hi
    return res, lo, hi
