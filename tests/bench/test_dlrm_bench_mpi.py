"""bench/dlrm.py's two DLRM designs over P ranks (run with `mpirun -np 2|3 python -m pytest --with-mpi
tests/bench/test_dlrm_bench_mpi.py`): mgg's step (MultiTableEmbeddingBag, MPI) and the
torch.distributed all-to-all design (gloo) give the losses, tables and MLP weights of the float64
single-process DLRM trained on all ranks' batches, and so agree with each other."""
import pytest
import torch

from bench import dlrm as bench_dlrm
from bench.dlrm_a2a import AllToAllDLRM
from mgg.embedding.dlrm_data import DLRMBatches
from mgg.embedding.dlrm_model import DLRMConfig
from mgg.embedding.dlrm_train import MggDLRM
from mgg.graph import make_store
from mgg.testing.dlrm_reference import ReferenceDLRM, assert_trained_like

pytestmark = pytest.mark.mpi(min_size=2)

# tables smaller than, equal to and larger than P rows: some ranks own none of a table's rows
CFG = DLRMConfig(cards=(50, 2, 300, 3, 1000, 1), dim=4, bot=(8,), top=(16, 1), zipf=1.05, lr=0.5, emb_lr=0.3, seed=2)
B, STEPS = 24, 4


def test_both_designs_train_the_float64_reference_over_ranks(gloo):
    comm = gloo
    designs = {"mgg": MggDLRM(CFG, comm, make_store(comm, "cpu")), "a2a": AllToAllDLRM(CFG, torch.device("cpu"))}
    assert designs["mgg"].emb.store.name == "mpi"
    ref = ReferenceDLRM(CFG, B, comm.size)
    want = [ref.step() for _ in range(STEPS)]
    try:
        losses = {}
        for name, m in designs.items():
            losses[name] = bench_dlrm.run_steps(m, DLRMBatches(CFG, B, comm.rank), STEPS, torch.device("cpu"), comm)
            assert_trained_like(m, ref, losses[name], want, name)
        assert bench_dlrm.losses_disagree(losses["mgg"], losses["a2a"], 1e-5) is None
    finally:
        designs["mgg"].free()


def test_bench_refuses_designs_that_train_differently_on_every_rank(monkeypatch):
    monkeypatch.setattr(AllToAllDLRM, "_adagrad", lambda self, rows, grad: None)  # tables never updated
    rc = bench_dlrm.main(["--max-rows", "500", "--tables", "4", "--batch-size", "64", "--steps", "2", "--emb-lr", "1.0"])
    assert rc == 1
