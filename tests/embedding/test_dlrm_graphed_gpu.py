"""MggDLRM's step replayed from a CUDA graph on the GPU store (mgg.embedding.dlrm_graphed) against
the eager step: the same losses, tables and MLP weights over 8 steps (one batch of another shape
among them runs eagerly), the graph captured and replayed; a bad id in a replayed step raises the
eager step's error, on every rank also when only one rank's batch has it, and that step writes
nothing (tables, optimizer state and MLP weights as before it). Runs alone (P = 1) and
under `mpirun -np 2 python -m pytest tests/embedding/test_dlrm_graphed_gpu.py` (every rank on its
own GPU); skipped without a GPU."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

from mgg.embedding.dlrm_data import DLRMBatches  # noqa: E402
from mgg.embedding.dlrm_model import DLRMConfig  # noqa: E402
from mgg.embedding.dlrm_train import MggDLRM  # noqa: E402
from mgg.graph import make_store  # noqa: E402
from mgg.runtime import world  # noqa: E402

CFG = DLRMConfig(cards=(50, 2, 3000, 3, 10000, 1), dim=8, bot=(16,), top=(32, 1), zipf=1.05, lr=0.5, emb_lr=0.3, seed=4)
B, STEPS = 256, 8


@pytest.fixture(scope="module")
def env():
    comm = world()
    return comm, make_store(comm, "gpu"), torch.device("cuda", torch.cuda.current_device())


def _batches(comm, dev, sizes):
    streams: dict = {}
    return [streams.setdefault(b, DLRMBatches(CFG, b, comm.rank)).next().to(dev) for b in sizes]


def _train(model, batches, comm):
    losses = [comm.allreduce_scalar(float(model.step(b))) for b in batches]
    tables = [model.table(t) for t in range(CFG.num_tables)]
    return losses, tables, [p.detach().cpu().clone() for p in model.dense.parameters()]


def _state(model):
    """Every table (gathered), the row-wise Adagrad state of this rank and the MLP weights."""
    return ([model.table(t) for t in range(CFG.num_tables)] + [model.emb_opt.state.cpu().clone()]
            + [p.detach().cpu().clone() for p in model.dense.parameters()])


def _same(a, b):
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("sharding", ["range", "hash"])
def test_the_replayed_step_trains_like_the_eager_step(env, sharding):
    comm, store, dev = env
    sizes = [B] * 5 + [B // 2] + [B] * (STEPS - 6)  # the 6th batch has another shape: eager
    batches = _batches(comm, dev, sizes)
    eager = MggDLRM(CFG, comm, store, sharding, cuda_graph=False)
    try:
        assert eager.graphed is None
        want = _train(eager, batches, comm)
    finally:
        eager.free()
    model = MggDLRM(CFG, comm, store, sharding)  # the default on the GPU store: replayed
    try:
        got = _train(model, batches, comm)
        g = model.graphed
        assert g is not None and g.captured, g.why_eager
        # steps 1-2 warm-up, 3 the capture step, 6 another shape: eager; 4, 5, 7, 8 replayed
        assert (g.replays, g.eager_steps) == (4, 4)
    finally:
        model.free()
    assert got[0] == pytest.approx(want[0], rel=1e-4)
    for t, (a, b) in enumerate(zip(got[1], want[1])):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"table {t}")
    for a, b in zip(got[2], want[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_bad_id_in_a_replayed_step_raises_the_eager_error(env):
    comm, store, dev = env
    batches = _batches(comm, dev, [B] * 4)
    bad = DLRMBatches(CFG, B, comm.rank + 7).next().to(dev)
    bad.ids[2][7] = CFG.cards[2] + 5  # on every rank
    eager = MggDLRM(CFG, comm, store, cuda_graph=False)
    try:
        with pytest.raises(IndexError) as want:
            eager.step(bad)
    finally:
        eager.free()
    assert str(want.value) == f"table C3: index {CFG.cards[2] + 5} out of range [0, {CFG.cards[2]})"
    model = MggDLRM(CFG, comm, store)
    try:
        for b in batches:
            model.step(b)
        g = model.graphed
        assert g.captured and g.replays == 1, g.why_eager
        before = _state(model)
        with pytest.raises(IndexError) as got:
            model.step(bad)
        assert g.replays == 2 and str(got.value) == str(want.value)
        _same(_state(model), before)  # the held step wrote nothing
        if comm.size > 1:  # rank 0's bad id: every rank raises rank 0's error, and no rank writes
            one = DLRMBatches(CFG, B, comm.rank + 9).next().to(dev)
            if comm.rank == 0:
                one.ids[4][0] = -3
            with pytest.raises(IndexError, match=rf"^table C5: index -3 out of range \[0, {CFG.cards[4]}\)$"):
                model.step(one)
            _same(_state(model), before)
        loss = model.step(batches[0])  # recorded errors are cleared: the next replay is clean
        assert g.replays == (4 if comm.size > 1 else 3) and torch.isfinite(loss)
    finally:
        model.free()
