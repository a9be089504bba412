"""mgg.apps.sampled_graphed: a batch padded to fixed capacities trains exactly as the batch itself
(SAGE and GCN, with dropout: the same loss and gradients as the eager step, on the CPU's torch
path, against the eager model), and PaddedStep's control flow -- eager warm-up, one capture,
replay, eager steps for batches above a capacity, every rank eager when one rank cannot capture --
with the CUDA graph replaced by a recorder (the GPU run is a device test)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mgg.apps.sampled_graphed import PaddedStep, can_pad
from mgg.nn import IndexedRows, SampledGAT, SampledGCN, SampledSAGE, cross_entropy_sum
from mgg.runtime import Communicator
from mgg.sample import sample_blocks
from mgg.sample.block import SampledBatch
from mgg.testing.graphs import random_csr
from mgg.testing.cuda_graph import RecordingGraph


def a_batch(seed: int, n: int = 300, batch: int = 12, fanouts=(4, 3), table: torch.Tensor | None = None) -> SampledBatch:
    """A sampled batch of a random graph; with `table` its features are IndexedRows(table, n_id)."""
    indptr, indices = random_csr(n, 8 * n, seed=seed)
    rng = np.random.default_rng(seed)
    seeds = torch.from_numpy(rng.choice(n, batch, replace=False).astype(np.int64))
    n_id, blocks = sample_blocks(torch.from_numpy(indptr), torch.from_numpy(indices), seeds, list(fanouts),
                                 torch.Generator().manual_seed(seed))
    x = (torch.from_numpy(rng.standard_normal((n, 6)).astype(np.float32))[n_id] if table is None
         else IndexedRows(table, n_id))
    y = torch.from_numpy(rng.integers(0, 3, batch).astype(np.int64))
    return SampledBatch(n_id=n_id, blocks=blocks, x=x, y=y, seeds=seeds)


def loss_and_grads(model, x, blocks, y, w=None, seed=7):
    model.zero_grad()
    loss = cross_entropy_sum(model(x, blocks, torch.Generator().manual_seed(seed)), y, w)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("cls", [SampledSAGE, SampledGCN])
@pytest.mark.parametrize("indexed", [False, True])
def test_a_padded_batch_trains_as_the_batch_itself(cls, indexed):
    """Padded rows (stale values, or stale ids into the table) change no real row's result."""
    torch.manual_seed(0)
    model = cls(6, 8, 3, layers=2, dropout=0.5)
    assert can_pad(model)
    table = torch.randn(300, 6) if indexed else None
    batch = a_batch(1, table=table)
    step = PaddedStep(model, None, None, Communicator(comm=None))
    step._seen = [s + 5 for s in step._sizes(batch)]  # capacities above this batch's sizes
    step.bufs = step._allocate(batch)
    if indexed:
        step.bufs.x.index.fill_(299)  # ids of an earlier batch: valid rows, never read by a real row
        assert step._same_input(batch) and not step._same_input(a_batch(1, table=torch.randn(300, 6)))
        assert not step._same_input(a_batch(1))
    else:
        step.bufs.x.fill_(3.0)  # stale rows from an earlier batch: finite, never read by a real row
    step._load(batch)
    assert all(s < c for s, c in zip(step._sizes(batch), step._caps))
    want_loss, want_grads = loss_and_grads(model, batch.x, batch.blocks, batch.y)
    b = step.bufs
    got_loss, got_grads = loss_and_grads(model, b.x, b.blocks, b.y, b.w)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_gat_cannot_be_padded():
    assert not can_pad(SampledGAT(6, 4, 3, layers=2, heads=2))


class FakeComm(Communicator):
    def __init__(self, other_rank_fails=False):
        super().__init__(comm=None)
        self.other_rank_fails = other_rank_fails

    def allreduce_scalar(self, value, op="sum"):
        return max(value, 1.0 if self.other_rank_fails else 0.0)


def recording_step(comm, fail=False):
    calls = []
    step = PaddedStep(torch.nn.Module(), lambda b: calls.append("eager") or torch.tensor(1.0), None, comm, warmup=2)

    def capture(batch):
        calls.append("capture")
        step.bufs = None
        step._caps = [c + 3 for c in step._sizes(batch)]
        why = "RuntimeError: no" if fail else ""
        if comm.allreduce_scalar(1.0 if why else 0.0, "max") > 0:
            step.why_eager = why or "another rank could not capture the step"
            return
        step.graph, step.loss, step.captured = RecordingGraph(), torch.tensor(2.0), True

    step._capture = capture
    step._load = lambda batch: calls.append("load")
    return step, calls


def test_warm_up_capture_replay_and_oversized_batches_run_eagerly():
    step, calls = recording_step(FakeComm())
    small, big = a_batch(2, batch=8), a_batch(3, batch=40, fanouts=(8, 8))
    for _ in range(2):
        assert float(step(small)) == 1.0
    assert calls == ["eager", "eager"]
    assert float(step(small)) == 2.0 and float(step(small)) == 2.0
    assert calls[2:] == ["capture", "load", "load"] and step.graph.replays == 2
    assert float(step(big)) == 1.0  # above the capacities: eager
    assert (step.replays, step.eager_steps) == (2, 3)


@pytest.mark.parametrize("other_rank_fails,self_fails", [(True, False), (False, True)])
def test_a_failed_capture_on_any_rank_leaves_every_rank_eager(other_rank_fails, self_fails):
    step, calls = recording_step(FakeComm(other_rank_fails), fail=self_fails)
    batch = a_batch(4)
    for _ in range(4):
        assert float(step(batch)) == 1.0
    assert calls.count("capture") == 1 and not step.captured and step.why_eager


@pytest.mark.parametrize("flag,device,model,want", [
    (None, "cuda", "sage", True), (None, "cuda", "gcn", True),   # the default on the GPU
    (None, "cuda", "gat", False),                                 # GAT's index_add: eager
    (None, "cpu", "sage", False), (False, "cuda", "sage", False),  # no GPU; --no-cuda-graph
    (True, "cuda", "gcn", True),
])
def test_the_padded_graph_is_on_where_it_applies(flag, device, model, want):
    from mgg.apps.config import TrainConfig
    from mgg.apps.sampled import sampled_cuda_graph
    from mgg.nn.registry import model_entry

    net = model_entry(model).sampled_model(6, 8, 3, 2, 0.5)
    assert sampled_cuda_graph(TrainConfig(mode="sampled", model=model, cuda_graph=flag), device, net) is want


@pytest.mark.parametrize("device,model,needle", [("cpu", "sage", "GPU backend"), ("cuda", "gat", "--model gat")])
def test_an_explicit_cuda_graph_that_cannot_apply_names_why(device, model, needle):
    from mgg.apps.config import TrainConfig, UserError
    from mgg.apps.sampled import sampled_cuda_graph
    from mgg.nn.registry import model_entry

    net = model_entry(model).sampled_model(6, 8, 3, 2, 0.5)
    with pytest.raises(UserError, match=needle):
        sampled_cuda_graph(TrainConfig(mode="sampled", model=model, cuda_graph=True), device, net)
