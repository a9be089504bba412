"""--cuda-graph (mgg.apps.graphed.CapturedStep and the checks in mgg.apps.full): the flags it
refuses, naming them, before any GPU work; and the capture's control flow -- eager warm-up,
capture, replay, and every rank falling back to the eager step when one rank cannot capture --
with torch.cuda's graph pieces replaced by recorders (the GPU run itself is a device test:
bench/fullgraph.py --cuda-graph)."""
from __future__ import annotations

import contextlib

import pytest
import torch

from mgg.apps.config import TrainConfig, UserError
from mgg.apps.full import check_cuda_graph, resolve_cuda_graph
from mgg.apps.graphed import CapturedStep
from mgg.runtime import Communicator
from mgg.testing.cuda_graph import RecordingGraph


@pytest.mark.parametrize("changes,needle", [({"tune": True}, "--tune"), ({"profile_steps": True}, "--profile-steps")])
def test_refused_combinations_name_the_flag(changes, needle):
    cfg = TrainConfig(cuda_graph=True, **{"dropout": 0.0, **changes})
    with pytest.raises(UserError, match=needle.replace("-", r"\-")):
        check_cuda_graph(cfg)
    check_cuda_graph(TrainConfig(cuda_graph=False, dropout=0.5, tune=True))  # off: nothing to check
    check_cuda_graph(TrainConfig(cuda_graph=True, dropout=0.5), "cuda")  # dropout: seeds on the GPU


def test_needs_a_gpu_and_the_cli_refuses_it_on_cpu():
    with pytest.raises(UserError, match="GPU backend"):
        check_cuda_graph(TrainConfig(cuda_graph=True, dropout=0.0), "cpu")
    check_cuda_graph(TrainConfig(cuda_graph=True, dropout=0.0), "cuda")
    check_cuda_graph(TrainConfig(cuda_graph=True, dropout=0.5), "cuda", 2)  # P > 1 too
    from mgg.apps.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--cuda-graph", "--mode", "sampled", "--backend", "cpu"])
    assert e.value.code == 2


@pytest.mark.parametrize("changes,device,resumed,want", [
    ({}, "cuda", None, True),                          # the default on the GPU: replayed
    ({}, "cpu", None, False),                          # no GPU: eager
    ({"tune": True}, "cuda", None, False),             # the tuner switches kernels between steps
    ({"profile_steps": True}, "cuda", None, False),    # host timers between the parts
    ({}, "cuda", {"cuda_graph": False}, False),        # resumed: as the checkpoint was written
    ({}, "cuda", {"cuda_graph": True}, True),
    ({}, "cpu", {"cuda_graph": True}, False),
    ({"cuda_graph": False}, "cuda", None, False),      # --no-cuda-graph
    ({"cuda_graph": True}, "cuda", {"cuda_graph": False}, True),
])
def test_default_is_on_where_a_graph_applies(changes, device, resumed, want):
    cfg = resolve_cuda_graph(TrainConfig(dropout=0.5, **changes), device, 2, resumed)
    assert cfg.cuda_graph is want


def test_the_cli_flag_is_on_off_or_default():
    from mgg.apps.args import parse_args

    assert parse_args([]).cuda_graph is None
    assert parse_args(["--cuda-graph"]).cuda_graph is True
    assert parse_args(["--no-cuda-graph"]).cuda_graph is False
    assert parse_args(["--no-cuda-graph", "--tune"]).tune  # off: combines with everything
    with pytest.raises(UserError, match="GPU backend"):  # asked for by name on the CPU: refused
        resolve_cuda_graph(TrainConfig(cuda_graph=True), "cpu")


class _Comm:
    """One rank of a job whose other rank reports `other_failed`."""

    def __init__(self, other_failed: bool = False):
        self.other_failed, self.rank = other_failed, 0

    def allreduce_scalar(self, v, op):
        assert op == "max"
        return max(v, 1.0 if self.other_failed else 0.0)


def _patch(monkeypatch, fail: bool):
    graphs = []

    def make():
        graphs.append(RecordingGraph())
        return graphs[-1]

    @contextlib.contextmanager
    def capture(g):
        yield
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", make)
    monkeypatch.setattr(torch.cuda, "graph", capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    return graphs


def test_warmup_capture_then_replay(monkeypatch):
    graphs = _patch(monkeypatch, fail=False)
    calls = []
    step = CapturedStep(lambda e: calls.append(e) or torch.tensor(float(e)), _Comm(), warmup=2)
    losses = [step(e) for e in (1, 2, 3, 4, 5)]
    assert calls == [1, 2, 3]           # two eager epochs, then the step once, under capture
    assert step.captured and not step.why_eager
    assert graphs[0].replays == 3       # epoch 3 (the capture only records), 4 and 5
    assert float(losses[-1]) == 3.0     # the graph's output tensor (the fake replays change nothing)


def test_close_releases_the_graph_once_then_runs_eagerly(monkeypatch):
    """close(): the graph is reset (nothing captured outlives training, NVSHMEM's on-stream
    collectives included, when the store finalizes at exit); idempotent; later calls run eagerly."""
    graphs = _patch(monkeypatch, fail=False)
    calls = []
    step = CapturedStep(lambda e: calls.append(e) or torch.tensor(float(e)), _Comm(), warmup=1)
    for e in (1, 2, 3):
        step(e)
    assert step.captured and graphs[0].replays == 2
    step.close()
    assert getattr(graphs[0], "reset_called", False) and step.graph is None and not step.captured
    assert step.why_eager == "released after training"
    step.close()                          # idempotent
    step(4)
    assert calls == [1, 2, 4] and graphs[0].replays == 2 and len(graphs) == 1


def test_close_resets_even_when_the_sync_fails(monkeypatch):
    graphs = _patch(monkeypatch, fail=False)
    step = CapturedStep(lambda e: torch.tensor(0.0), _Comm(), warmup=1)
    step(1), step(2)

    def broken(*a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    with pytest.raises(RuntimeError, match="illegal memory"):
        step.close()
    assert getattr(graphs[0], "reset_called", False) and step.graph is None


@pytest.mark.parametrize("mine,other", [(True, False), (False, True)])
def test_any_rank_failing_sends_every_rank_back_to_eager(monkeypatch, capsys, mine, other):
    graphs = _patch(monkeypatch, fail=mine)
    calls = []
    step = CapturedStep(lambda e: calls.append(e) or torch.tensor(0.0), _Comm(other_failed=other), warmup=1)
    for e in (1, 2, 3, 4):
        step(e)
    assert not step.captured and step.why_eager
    assert ("RuntimeError" in step.why_eager) == mine
    assert calls == [1, 2, 2, 3, 4]     # epoch 2 ran under the failed capture, then eagerly
    assert graphs[0].replays == 0 and getattr(graphs[0], "reset_called", False)
    assert "could not be captured" in capsys.readouterr().err


def test_warmup_must_be_positive():
    with pytest.raises(ValueError, match="warmup"):
        CapturedStep(lambda e: None, Communicator(), warmup=0)
