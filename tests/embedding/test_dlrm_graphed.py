"""mgg.embedding.dlrm_graphed's control flow on the CPU, the CUDA graph replaced by a recorder (the
GPU run is tests/embedding/test_dlrm_graphed_gpu.py): eager warm-up, one capture step, replays of
batches of the buffers' shapes, eager steps for other shapes, every rank eager when one rank
cannot capture, refusal of "max" tables and of the CPU store, the capture mode of the tables, the
input errors raised on every rank with the failing rank's message; and MggDLRM's switch."""
import pytest
import torch

from mgg.embedding import TableConfig
from mgg.embedding.dlrm_data import DLRMBatches
from mgg.embedding.dlrm_graphed import GraphedDLRMStep, _Buffers, refusal
from mgg.embedding.dlrm_model import DLRMConfig
from mgg.embedding.dlrm_train import MggDLRM
from mgg.graph import make_store
from mgg.runtime import Communicator, world
from mgg.testing.cuda_graph import RecordingGraph

CFG = DLRMConfig(cards=(50, 7, 300), dim=4, bot=(8,), top=(16, 1), seed=5)


class FakeComm(Communicator):
    """Rank 1 of two; the other rank (0) contributes `other` to an all-reduce (1.0 when it has an
    input error) and `other_error` to an all-gather."""

    def __init__(self, other=0.0, other_error=None):
        super().__init__(comm=None)
        self.other, self.other_error = other, other_error

    @property
    def size(self):
        return 2

    def allreduce_scalar(self, value, op="sum"):
        return max(value, 1.0 if self.other_error else self.other)

    def allgather(self, obj):
        return [self.other_error, obj]


class FakeEmb:
    def __init__(self, modes=("sum",), gpu=True):
        self.tables = [TableConfig(10, 4, m, name=f"C{t + 1}") for t, m in enumerate(modes)]
        self._gpu = gpu
        self.checks, self.capturable_pooling = "sync", False
        self.error = None
        self.cleared = 0

    def raise_input_errors(self):
        err, self.error = self.error, None
        if err is not None:
            raise err

    def clear_gradients(self):
        self.cleared += 1

    def capture_refs(self):
        return []


def batch(b=8, seed=0):
    return DLRMBatches(CFG, b, seed).next()


def recording_step(comm, emb=None, fail=False):
    calls = []
    emb = emb or FakeEmb()

    def step(dense, ids, offsets, labels, fixed):
        calls.append(("fixed" if fixed else "eager", emb.checks, emb.capturable_pooling))
        return torch.tensor(1.0)

    s = GraphedDLRMStep(step, emb, comm, warmup=2)

    def capture(b):  # the real one: buffers, the fixed step on a side stream, the graph
        s.bufs = _Buffers.like(b, "cpu")
        with s.capture_mode():
            step(b.dense, b.ids, b.offsets, b.labels, True)
        why = "RuntimeError: no" if fail else ""
        if comm.allreduce_scalar(1.0 if why else 0.0, "max") > 0:
            s.why_eager = why or "another rank could not capture the step"
            s.bufs = None
            return torch.tensor(3.0)
        s.graph, s.loss, s.captured = RecordingGraph(), torch.tensor(2.0), True
        return torch.tensor(3.0)

    s._capture = capture
    return s, calls, emb


def test_warm_up_capture_replay_and_other_shapes_run_eagerly():
    s, calls, emb = recording_step(Communicator(comm=None))
    small, big = batch(8), batch(12)
    assert [float(s(small)) for _ in range(5)] == [1.0, 1.0, 3.0, 2.0, 2.0]
    assert [c[0] for c in calls] == ["eager", "eager", "fixed"]
    assert calls[2][1:] == ("deferred", True)  # the capturable form
    assert (emb.checks, emb.capturable_pooling) == ("sync", False)  # restored after it
    assert s.graph.replays == 2 and s.replays == 2 and s.captured
    assert float(s(big)) == 1.0 and calls[-1] == ("eager", "sync", False)  # another shape: eager
    assert (s.replays, s.eager_steps) == (2, 4)
    got = s(small)
    got.add_(5)  # a returned loss is the caller's: the next replay does not change it
    assert float(s(small)) == 2.0 and float(got) == 7.0


def test_the_ranks_replay_together_or_step_eagerly_together():
    comm = FakeComm()
    s, calls, _ = recording_step(comm)
    b = batch(8)
    assert [float(s(b)) for _ in range(4)] == [1.0, 1.0, 3.0, 2.0]
    comm.other = 1.0  # rank 0's batch has another shape: this rank steps eagerly too
    assert float(s(b)) == 1.0 and calls[-1][0] == "eager"
    comm.other = 0.0
    assert float(s(b)) == 2.0 and (s.replays, s.eager_steps) == (2, 4)


def test_buffers_take_a_batch_of_their_shapes():
    b = batch(8)
    bufs = _Buffers.like(b, "cpu")
    bufs.load(b)
    assert torch.equal(bufs.dense, b.dense) and all(torch.equal(x, y) for x, y in zip(bufs.ids, b.ids))
    assert bufs.fits(batch(8, seed=1)) and not bufs.fits(batch(9))
    other = batch(8)
    other.ids = [i.to(torch.int32) for i in other.ids]
    assert not bufs.fits(other)


@pytest.mark.parametrize("other_fails,self_fails", [(True, False), (False, True)])
def test_a_failed_capture_on_any_rank_leaves_every_rank_eager(other_fails, self_fails):
    s, calls, _ = recording_step(FakeComm(other=1.0 if other_fails else 0.0), fail=self_fails)
    b = batch()
    assert [float(s(b)) for _ in range(5)] == [1.0, 1.0, 3.0, 1.0, 1.0]
    assert [c[0] for c in calls].count("fixed") == 1 and not s.captured and s.why_eager


@pytest.mark.parametrize("emb,needle", [(FakeEmb(("sum", "max")), "mode 'max'"), (FakeEmb(gpu=False), "GPU store")])
def test_what_cannot_be_captured_runs_eagerly_with_the_reason(emb, needle):
    assert needle in refusal(emb)
    s = GraphedDLRMStep(lambda *a: torch.tensor(1.0), emb, Communicator(comm=None), warmup=1)
    for _ in range(3):
        s(batch())
    assert not s.captured and needle in s.why_eager and s.eager_steps == 3
    assert refusal(FakeEmb(("sum", "mean"))) == ""


def test_input_errors_are_raised_on_every_rank_with_the_failing_ranks_message():
    emb = FakeEmb()
    s = GraphedDLRMStep(None, emb, Communicator(comm=None))
    s.raise_input_errors()  # nothing recorded
    emb.error = IndexError("table C1: index 12 out of range [0, 10)")
    with pytest.raises(IndexError, match=r"^table C1: index 12 out of range \[0, 10\)$"):
        s.raise_input_errors()
    # two ranks: this one clean, rank 0 failed -> the same error here
    rank0 = ("ValueError", "table C2: offsets must start at 0, got offsets[0]=1")
    s = GraphedDLRMStep(None, FakeEmb(), FakeComm(other_error=rank0))
    with pytest.raises(ValueError, match=r"^table C2: offsets must start at 0"):
        s.raise_input_errors()
    # both failed: rank 0's error on both
    emb = FakeEmb()
    emb.error = IndexError("table C1: index -1 out of range [0, 10)")
    s = GraphedDLRMStep(None, emb, FakeComm(other_error=("IndexError", "table C3: index 99 out of range [0, 10)")))
    with pytest.raises(IndexError, match="C3: index 99"):
        s.raise_input_errors()
    # both clean: nothing
    GraphedDLRMStep(None, FakeEmb(), FakeComm()).raise_input_errors()


def test_mgg_dlrm_on_the_cpu_store_steps_eagerly():
    comm = world(use_mpi=False) if world().size == 1 else world()
    if comm.size != 1:
        pytest.skip("one process")
    m = MggDLRM(CFG, comm, make_store(comm, "cpu"))
    try:
        assert m.graphed is None  # the default on the CPU
        loss = m.step(batch())
        assert loss.dim() == 0 and torch.isfinite(loss)
    finally:
        m.free()
    with pytest.raises(ValueError, match="cuda_graph=True needs the GPU store"):
        MggDLRM(CFG, comm, make_store(comm, "cpu"), cuda_graph=True)
    m = MggDLRM(CFG, comm, make_store(comm, "cpu"), cuda_graph=False)
    assert m.graphed is None
    m.free()


def test_warmup_must_be_positive():
    with pytest.raises(ValueError, match="warmup"):
        GraphedDLRMStep(None, FakeEmb(), Communicator(comm=None), warmup=0)
