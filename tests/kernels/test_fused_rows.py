"""The joined CSR of halo_csr's fused pass (mgg/kernels/fused_rows.py), on the CPU: each row's
local and remote entries over the table [own rows | halo rows] give the rank's rows of the
float64 aggregation matrix, and the joined weight factors reproduce every weight."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mgg.kernels.csr_rows import factor_weights
from mgg.kernels.fused_rows import fuse_rows, fused_csr
from mgg.kernels.halo_csr import remote_factors
from mgg.runtime.partition import partition_ranges
from mgg.runtime.plan import build_plan
from mgg.testing.graphs import hub_graph, random_csr
from mgg.testing.reference import aggregation_matrix, edge_weights, self_weights


def _plans(indptr, indices, kind, world):
    b = partition_ranges(indptr, world)
    w = edge_weights(indptr, indices, kind).astype(np.float32)
    d = self_weights(indptr, kind)
    for r in range(world):
        a, e = indptr[b[r]], indptr[b[r + 1]]
        yield b, build_plan(indptr[b[r]: b[r + 1] + 1] - a, indices[a:e], w[a:e],
                            None if d is None else d[b[r]: b[r + 1]].astype(np.float32), b, r)


def _joined(plan, kind):
    t = torch.from_numpy
    local = (t(plan.local_indptr.astype(np.int64)), t(plan.local_indices.astype(np.int32)),
             t(plan.local_weight.astype(np.float32)))
    remote = (t(plan.remote_indptr.astype(np.int64)), t(plan.remote_slot.astype(np.int32)),
              t(plan.remote_weight.astype(np.float32)))
    lf = factor_weights(plan, kind)
    rf = remote_factors(plan, lf, remote[0], remote[1], remote[2])
    return fused_csr(local, lf, remote, rf, plan.n_local, plan.halo_size)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind,mode", [("gcn", "column"), ("sum", "one"), ("mean", "one"), ("sum_self", "one")])
def test_joined_rows_are_the_ranks_rows_of_the_matrix(kind, mode, world):
    indptr, indices = hub_graph()
    ref = aggregation_matrix(indptr, indices, kind)
    for b, plan in _plans(indptr, indices, kind, world):
        csr = _joined(plan, kind)
        n, h = plan.n_local, plan.halo_size
        assert csr.n_src == n + h and h > 0
        # table row -> global node: own rows, then each halo slot's owner row
        glob = np.concatenate([plan.lo + np.arange(n), b[plan.halo_pe()] + plan.halo_row])
        src = csr.src.numpy()
        assert src.min() >= 0 and src.max() < n + h
        w = csr.weight.numpy().astype(np.float64)
        got = sp.csr_matrix((w, glob[src], csr.indptr.numpy()), shape=(n, len(indptr) - 1))
        if plan.has_self:
            got = got + sp.csr_matrix((plan.self_weight.astype(np.float64), (np.arange(n), plan.lo + np.arange(n))),
                                      shape=got.shape)
        want = ref[plan.lo: plan.hi]
        assert abs(got - want).max() < 1e-6 * abs(want).max()
        # each row: its local entries first (columns < n), then its remote ones
        for t in range(0, n, max(1, n // 50)):
            row = src[csr.indptr[t]: csr.indptr[t + 1]]
            assert np.all(np.diff((row >= n).astype(int)) >= 0)
        f = csr.factors
        assert f.mode == mode, f.note
        rows = np.repeat(np.arange(n), np.diff(csr.indptr.numpy()))
        fac = (f.row[rows] if f.row is not None else np.ones(len(src))) * (f.col[src] if f.col is not None else 1.0)
        assert np.allclose(fac, w, rtol=2e-6, atol=0)


def test_weights_that_do_not_factor_are_read_per_edge():
    indptr, indices = random_csr(300, 3000, seed=5)
    for _, plan in _plans(indptr, indices, "gcn", 2):
        bump = 1 + 0.5 * (np.arange(plan.num_remote_edges) % 2)  # no longer dinv[row] * cf[slot]
        plan.remote_weight = (plan.remote_weight * bump).astype(np.float32)
        csr = _joined(plan, "gcn")
        assert csr.factors.mode == "weighted"


def test_rows_with_only_one_part():
    """Rows with no local entries, no remote entries, or none at all keep their order and place."""
    ip_l = torch.tensor([0, 2, 2, 3, 3])
    ip_r = torch.tensor([0, 1, 3, 3, 3])
    local = (ip_l, torch.tensor([1, 0, 2], dtype=torch.int32), torch.tensor([1.0, 2.0, 3.0]))
    remote = (ip_r, torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([4.0, 5.0, 6.0]))
    ip, src, w = fuse_rows(local, remote, 4)
    assert ip.tolist() == [0, 3, 5, 6, 6]
    assert src.tolist() == [1, 0, 8, 4, 6, 2]
    assert w.tolist() == [1.0, 2.0, 4.0, 5.0, 6.0, 3.0]
