import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mgg.runtime.partition import partition_ranges
from mgg.kernels.variants import get_variant
from mgg.runtime.plan import AggregationPlan, PlanParams, build_plan, cut_partitions, warp_worklist
from mgg.testing.graphs import random_csr


def _plans(indptr, indices, world, params, node_of_pe=None):
    b = partition_ranges(indptr, world)
    w = np.arange(len(indices), dtype=np.float32) + 1  # distinct weights to track entries
    out = []
    for r in range(world):
        a, e = indptr[b[r]], indptr[b[r + 1]]
        out.append(build_plan(indptr[b[r]: b[r + 1] + 1] - a, indices[a:e], w[a:e], None, b, r, params,
                              node_of_pe))
    return b, w, out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.integers(0, 400), st.integers(1, 4), st.integers(1, 9), st.integers(1, 5),
       st.integers(1, 8), st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 4))
def test_plan_invariants(n, e, world, ps, dist, wpb, seed, ps_inter, ranks_per_node):
    indptr, indices = random_csr(n, e, seed, isolated=min(3, n - 1) if n > 4 else 0)
    params = PlanParams(ps, dist, wpb, ps_inter)
    node_of_pe = np.arange(world) // ranks_per_node
    b, w, plans = _plans(indptr, indices, world, params, node_of_pe)
    for p in plans:
        lo, hi = p.lo, p.hi
        assert p.rows_per_pe == max(1, int(np.diff(b).max()))
        # the split loses and invents nothing: per row, the multiset of (global source, weight)
        for i in range(hi - lo):
            a, z = indptr[lo + i], indptr[lo + i + 1]
            want = sorted(zip(indices[a:z].tolist(), w[a:z].tolist()))
            la, lz = p.local_indptr[i], p.local_indptr[i + 1]
            ra, rz = p.remote_indptr[i], p.remote_indptr[i + 1]
            got = [(int(s) + lo, float(x)) for s, x in zip(p.local_indices[la:lz], p.local_weight[la:lz])]
            rg = b[p.remote_pe[ra:rz]] + p.remote_row[ra:rz]
            got += [(int(s), float(x)) for s, x in zip(rg, p.remote_weight[ra:rz])]
            assert sorted(got) == want
        assert np.all((p.local_indices >= 0) & (p.local_indices < hi - lo))
        assert np.all(p.remote_pe != p.rank)
        assert np.all((p.remote_row >= 0) & (p.remote_row < np.diff(b)[p.remote_pe]))
        # neighbor partitions: <= ps (ps_inter for other-node ones), in order, covering the CSR
        inter_entry = node_of_pe[p.remote_pe] != node_of_pe[p.rank]
        for q, (a, z) in enumerate(p.remote_parts[:, 1:]):
            assert np.all(inter_entry[a:z] == p.remote_part_inter[q])
            assert z - a <= (ps_inter if p.remote_part_inter[q] else ps)
        for parts, ip, cap in ((p.local_parts, p.local_indptr, ps), (p.remote_parts, p.remote_indptr, max(ps, ps_inter))):
            sizes = parts[:, 2] - parts[:, 1]
            assert np.all((sizes >= 1) & (sizes <= cap))
            if len(parts):
                assert parts[0, 1] == 0 and parts[-1, 2] == ip[-1]
                assert np.all(parts[1:, 1] == parts[:-1, 2])
                assert np.all((ip[parts[:, 0]] <= parts[:, 1]) & (parts[:, 2] <= ip[parts[:, 0] + 1]))
        # Eq. 2-3 and the warp worklist
        L, R = len(p.local_parts), len(p.remote_parts)
        assert p.num_warps == -(-max(L, R) // dist)
        assert p.num_blocks == -(-p.num_warps // wpb)
        for col, total in ((0, L), (2, R)):
            covered = np.concatenate([np.arange(a, z) for a, z in p.warps[:, col: col + 2]]) if p.num_warps else []
            assert list(covered) == list(range(total))
            assert np.all(p.warps[:, col + 1] - p.warps[:, col] <= dist)
        # halo: unique rows, and every remote entry's slot points at its own (PE, row)
        hp = p.halo_pe()
        assert len(set(zip(hp.tolist(), p.halo_row.tolist()))) == p.halo_size
        assert np.all(hp[p.remote_slot] == p.remote_pe)
        assert np.all(p.halo_row[p.remote_slot] == p.remote_row)


def test_eq1_smem_and_cut():
    assert get_variant("paper").smem_bytes(16, 4, 4, 64) == 16 * 4 * 4 + 2 * 4 * 64 * 4  # Eq. 1
    parts = cut_partitions(np.array([0, 5, 5, 7]), 2)
    assert parts.tolist() == [[0, 0, 2], [0, 2, 4], [0, 4, 5], [2, 5, 7]]
    assert warp_worklist(5, 2, 2).tolist() == [[0, 2, 0, 2], [2, 4, 2, 2], [4, 5, 2, 2]]
    assert warp_worklist(0, 0, 3).shape == (0, 4)


def test_params_validated():
    for bad in (dict(ps=0), dict(dist=0), dict(wpb=33), dict(ps=2.5)):
        with pytest.raises(ValueError):
            PlanParams(**bad)


def test_with_params_and_save_load(tmp_path):
    indptr, indices = random_csr(50, 300, 1)
    _, _, plans = _plans(indptr, indices, 3, PlanParams(4, 2, 2))
    p = plans[1]
    q = p.with_params(PlanParams(8, 1, 4))
    assert q.ps == 8 and q.local_parts[:, 2].max(initial=0) == p.local_indptr[-1]
    path = tmp_path / "plan.npz"
    q.save(path)
    r = AggregationPlan.load(path)
    for f in ("local_parts", "remote_parts", "warps", "halo_row", "remote_slot", "local_weight"):
        assert np.array_equal(getattr(r, f), getattr(q, f))
    assert (r.rank, r.ps, r.dist, r.wpb, r.has_self) == (q.rank, 8, 1, 4, False)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="bad.npz"):
        AggregationPlan.load(bad)


def test_build_plan_rejects_mismatched_rows():
    b = np.array([0, 2, 4])
    with pytest.raises(ValueError, match="rank 0"):
        build_plan(np.array([0, 1]), np.array([1]), np.array([1.0]), None, b, 0)
