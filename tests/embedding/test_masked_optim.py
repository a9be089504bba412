"""The sparse optimizers' masked update (`step(fixed=True)`: a gradient of a fixed shape, rows -1
where nothing, as a step replayed from a CUDA graph produces it) against their update of the
unique rows on the same gradient: the same table and state, bit for bit (CPU), with tables of two
widths (row_dims by table) and row 0 both used and standing in for the empty places."""
import numpy as np
import pytest
import torch

from mgg.embedding import MultiTableEmbeddingBag, RowWiseAdagrad, SparseSGD, TableConfig
from mgg.runtime import world


@pytest.fixture(scope="module")
def comm():
    return world(use_mpi=False) if world().size == 1 else world()


@pytest.mark.parametrize("cls", [SparseSGD, RowWiseAdagrad])
@pytest.mark.parametrize("with_row0", [True, False])
def test_masked_update_is_the_update_of_the_unique_rows(comm, cls, with_row0):
    if comm.size != 1:
        pytest.skip("one process")
    tables = [TableConfig(30, 4, "sum"), TableConfig(25, 6, "mean")]
    with MultiTableEmbeddingBag(tables, comm=comm, seed=2) as emb:
        rng = np.random.default_rng(3)
        n_local = emb.layout.rows_per_pe
        rows = np.sort(rng.choice(np.arange(1, n_local), 20, replace=False))
        if with_row0:
            rows[0] = 0
        g = torch.from_numpy(rng.standard_normal((len(rows), emb.dim))).float()
        m = 3 * len(rows)  # the fixed shape: the rows spread over it, -1 (with junk values) elsewhere
        places = np.sort(rng.choice(m, len(rows), replace=False))
        fixed_rows = torch.full((m,), -1, dtype=torch.int64)
        fixed_rows[torch.from_numpy(places)] = torch.from_numpy(rows)
        fixed_g = torch.from_numpy(rng.standard_normal((m, emb.dim))).float()
        fixed_g[torch.from_numpy(places)] = g
        kw = {} if cls is SparseSGD else {"initial_accumulator_value": 0.0, "eps": 1e-8}
        want_opt, got_opt = cls(emb, lr=0.2, **kw), cls(emb, lr=0.2, **kw)
        if cls is RowWiseAdagrad:  # an earlier step's state
            want_opt.state.copy_(torch.from_numpy(rng.random(n_local)).float())
            got_opt.state.copy_(want_opt.state)
        want_loc, got_loc = emb.array.local.clone(), emb.array.local.clone()
        for _ in range(2):
            want_opt._apply(want_loc, torch.from_numpy(rows), g)
            valid = fixed_rows >= 0
            got_opt._apply_masked(got_loc, torch.where(valid, fixed_rows, 0), fixed_g, valid)
        assert torch.equal(got_loc, want_loc)
        if cls is RowWiseAdagrad:
            assert torch.equal(got_opt.state, want_opt.state)
            dims = emb.row_dims(torch.from_numpy(rows))
            assert set(dims.tolist()) == {4, 6}  # both tables' rows


def test_row_dims_keeps_its_device_vectors(comm):
    if comm.size != 1:
        pytest.skip("one process")
    with MultiTableEmbeddingBag([TableConfig(10, 3), TableConfig(10, 5)], comm=comm) as emb:
        rows = torch.arange(emb.layout.rows_per_pe)
        first = emb.row_dims(rows)
        cached = emb._dims_on[rows.device]
        assert torch.equal(emb.row_dims(rows), first) and emb._dims_on[rows.device] is cached
        assert first.tolist() == [3] * 10 + [5] * 10


@pytest.mark.parametrize("cls", [SparseSGD, RowWiseAdagrad])
def test_fixed_step_at_one_pe_is_the_per_call_step(comm, cls):
    """The whole optimizer step at P = 1 on a forward's slots (owner -1: unused, junk values):
    `step(fixed=True)` (the slots as rows, masked update) leaves the table and state of `step()`
    (the slots summed by row, update of the unique rows), bit for bit. The module is told its
    slots come from the device path (the CPU store stands in for the GPU store at P = 1)."""
    if comm.size != 1:
        pytest.skip("one process")
    rng = np.random.default_rng(5)
    tables = [TableConfig(30, 4, "sum"), TableConfig(25, 6, "sum")]
    mods = [MultiTableEmbeddingBag(tables, comm=comm, seed=4) for _ in range(2)]
    try:
        opts = [cls(m, lr=0.3) for m in mods]
        for _ in range(3):
            n = 40
            owner = torch.full((n + 1,), -1, dtype=torch.int32)
            k = int(rng.integers(10, n))
            owner[:k] = 0
            local = torch.zeros(n + 1, dtype=torch.int64)
            local[:k] = torch.from_numpy(rng.choice(mods[0].layout.rows_per_pe, k, replace=False))
            grads = torch.from_numpy(rng.standard_normal((n + 1, mods[0].dim))).float()
            for m in mods:
                m._gpu = True  # slots of the device path: (owner, local) pairs
                m._pending.append(((owner, local), grads.clone()))
            want = opts[0].step()
            got = opts[1].step(fixed=True)
            assert got.fixed and not want.fixed
            assert torch.equal(got.rows[got.rows >= 0].sort().values, want.rows)
        assert torch.equal(mods[0].array.local, mods[1].array.local)
        if cls is RowWiseAdagrad:
            assert torch.equal(opts[0].state, opts[1].state)
        with pytest.raises(RuntimeError, match="one pending GPU forward"):
            opts[1].step(fixed=True)  # nothing pending
    finally:
        for m in mods:
            m._gpu = False
            m.free()


@pytest.mark.parametrize("cls,eps", [(SparseSGD, None), (RowWiseAdagrad, 1e-10), (RowWiseAdagrad, 0.0)])
def test_gradients_scaled_by_zero_write_nothing(comm, cls, eps):
    """A step with bad input is held by scaling its pending row gradients by 0
    (`scale_gradients_`, what the replayed DLRM step does when a rank's lookup recorded an error):
    the fixed-shape update then leaves the table and the optimizer state as they were, bit for
    bit; by 1 it is the ordinary update. The CPU store records no error flag (0)."""
    if comm.size != 1:
        pytest.skip("one process")
    rng = np.random.default_rng(8)
    with MultiTableEmbeddingBag([TableConfig(30, 4, "sum")], comm=comm, seed=6) as emb:
        assert float(emb.input_error_flag()) == 0.0
        opt = cls(emb, lr=0.3) if eps is None else cls(emb, lr=0.3, eps=eps)  # eps 0: state 0 rows, no 0 * inf
        emb._gpu = True  # slots of the device path (the CPU store stands in at P = 1)
        try:
            for keep, changes in ((0.0, False), (1.0, True)):
                owner = torch.zeros(21, dtype=torch.int32)
                owner[-1] = -1
                local = torch.from_numpy(rng.choice(emb.layout.rows_per_pe, 21, replace=False))
                emb._pending.append(((owner, local), torch.from_numpy(rng.standard_normal((21, 4))).float()))
                table = emb.array.local.clone()
                state = opt.state.clone() if cls is RowWiseAdagrad else None
                emb.scale_gradients_(torch.tensor(keep))
                opt.step(fixed=True)
                assert torch.equal(emb.array.local, table) != changes
                if cls is RowWiseAdagrad:
                    assert torch.equal(opt.state, state) != changes
        finally:
            emb._gpu = False
