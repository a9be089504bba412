"""halo_csr's weight factorisation of the remote CSR (mgg.kernels.halo_csr.remote_factors), on CPU
tensors: the mode each kind gets at P = 2, forward and transposed, and that the factors
reproduce every remote weight (the GPU kernels are tested in tests/kernels/test_halo_csr_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mgg.kernels.halo_csr import remote_factors
from mgg.kernels.csr_rows import factor_weights
from mgg.runtime import partition_ranges
from mgg.runtime.plan import PlanParams, build_plan
from mgg.runtime.weights import diag_weights, pair_weights_by_row

from mgg.testing.graphs import random_csr


def _plan(kind: str, transposed: bool, rank: int = 0, world: int = 2):
    """Rank `rank`'s plan of `kind` over a random graph on `world` ranks (forward W: rows are
    targets; transposed W^T: rows are sources), with mgg's weights."""
    indptr, indices = random_csr(400, 6000, seed=7)
    n = len(indptr) - 1
    a = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n))
    deg_in = torch.from_numpy(np.diff(indptr).astype(np.int64))
    if transposed:
        a = a.T.tocsr()
    a.sort_indices()
    ip, idx = a.indptr.astype(np.int64), a.indices.astype(np.int64)
    b = partition_ranges(indptr, world)
    lo, hi = int(b[rank]), int(b[rank + 1])
    s, e = int(ip[lo]), int(ip[hi])
    rip = torch.from_numpy(ip[lo: hi + 1] - s)
    w = pair_weights_by_row(kind, deg_in, rip, lo, torch.from_numpy(idx[s:e]), row_is_target=not transposed)
    d = diag_weights(kind, deg_in, torch.arange(lo, hi))
    return build_plan(rip.numpy(), idx[s:e], w.numpy(), None if d is None else d.numpy(), b, rank, PlanParams())


def _factors(plan, kind):
    local = factor_weights(plan, kind)
    ip = torch.from_numpy(plan.remote_indptr.astype(np.int64))
    slot = torch.from_numpy(plan.remote_slot.astype(np.int32))
    w = torch.from_numpy(plan.remote_weight.astype(np.float32))
    return local, remote_factors(plan, local, ip, slot, w), ip, slot, w


@pytest.mark.parametrize("kind,transposed,mode", [("sum", False, "one"), ("sum", True, "one"),
                                                  ("mean", False, "one"), ("mean", True, "column"),
                                                  ("gcn", False, "column"), ("gcn", True, "column")])
def test_each_kind_factors_and_reproduces_the_weights(kind, transposed, mode):
    plan = _plan(kind, transposed)
    assert plan.num_remote_edges > 0 and plan.halo_size > 0
    local, rem, ip, slot, w = _factors(plan, kind)
    assert rem.mode == mode, rem.note
    row = torch.repeat_interleave(torch.arange(plan.n_local), ip[1:] - ip[:-1])
    f = torch.from_numpy(rem.row)[row] if rem.row is not None else torch.ones_like(w)
    if rem.col is not None:
        assert rem.col.shape == (plan.halo_size,)
        f = f * torch.from_numpy(rem.col)[slot.long()]
    # float64 reference of the weights: the product of the factors is within float32 rounding
    assert torch.allclose(f.double(), w.double(), rtol=3e-6, atol=0)


def test_weights_that_do_not_factor_are_read_per_edge():
    plan = _plan("gcn", False)
    local = factor_weights(plan, "gcn")
    w = torch.from_numpy(plan.remote_weight.astype(np.float32)).clone()
    w[3] *= 1.5  # one remote weight off the dinv[row] * dinv[col] pattern
    rem = remote_factors(plan, local, torch.from_numpy(plan.remote_indptr.astype(np.int64)),
                         torch.from_numpy(plan.remote_slot.astype(np.int32)), w)
    assert rem.mode == "weighted" and rem.max_rel_dev > 0.1


def test_no_remote_edges_and_weighted_local():
    plan = _plan("sum", False, world=1)
    local, rem, *_ = _factors(plan, "sum")
    assert plan.num_remote_edges == 0 and rem.mode == "one"
    plan2 = _plan("gcn", False)
    rem2 = remote_factors(plan2, factor_weights(plan2, None), torch.from_numpy(plan2.remote_indptr),
                          torch.from_numpy(plan2.remote_slot), torch.from_numpy(plan2.remote_weight))
    assert rem2.mode == "weighted"
