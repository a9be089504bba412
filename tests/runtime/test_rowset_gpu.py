"""Row sets (mgg.runtime.rowset) on the GPU executors: W_S and W_S^T against float64 scipy, for
every kernel variant, at P = 1 and under `mpirun -np 2` (the last rank then holds no row of S,
so its row-set plans are empty). Outputs are NaN-poisoned before each launch."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

from mgg.kernels.variants import get_variant, variant_names  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import DistGraph, RuntimeConfig  # noqa: E402
from mgg.testing.reference import aggregation_matrix  # noqa: E402
from mgg.testing.graphs import random_csr  # noqa: E402


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("variant", variant_names() + ("auto",))
@pytest.mark.parametrize("kind", ["sum", "gcn", "sum_self"])
def test_row_sets_match_reference(variant, kind):
    comm = world()
    if variant != "auto" and get_variant(variant).local_only and comm.size > 1:
        pytest.skip(f"{variant} aggregates ranks without remote work only")
    n = 900
    indptr, indices = random_csr(n, 12000, seed=21)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    with DistGraph(indptr, indices, comm, RuntimeConfig(4, 2, 4, backend="gpu", variant=variant)) as dg:
        chosen = np.sort(rng.choice(n, 80, replace=False))
        if comm.size > 1:
            chosen = chosen[chosen < dg.bounds[-2]]  # none on the last rank
        mine = chosen[(chosen >= dg.lo) & (chosen < dg.hi)] - dg.lo
        rs = dg.register_rows("s", mine)
        g = np.zeros((n, 16), np.float32)
        g[chosen] = rng.standard_normal((len(chosen), 16))
        outs, backs = [], []
        for _ in range(2):  # buffers reused
            for t in (False, True):
                dg.executor(kind, t, "s").poison = True
            outs.append(dg.aggregate(torch.from_numpy(dg.local(x).copy()).cuda(), kind, rows=rs)[rs.index].cpu().numpy())
            backs.append(dg.aggregate(torch.from_numpy(dg.local(g).copy()).cuda(), kind, transposed=True,
                                      rows=rs).cpu().numpy())
        lo, hi = dg.lo, dg.hi
    ws = aggregation_matrix(indptr, indices, kind)[chosen]
    want = (ws @ x.astype(np.float64))[(chosen >= lo) & (chosen < hi)]
    want_back = (ws.T @ g[chosen].astype(np.float64))[lo:hi]
    for out, back in zip(outs, backs):
        assert not np.isnan(out).any() and not np.isnan(back).any()
        assert out.shape == want.shape and (len(want) == 0 or rel_err(out, want) < 1e-5)
        assert rel_err(back, want_back) < 1e-5
