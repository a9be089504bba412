"""A float64 single-process DLRM: the oracle the sharded DLRM training steps are checked against.

Whole tables as dense float64 tensors (`init_table`, the same seeded values the sharded designs
start from), the `DLRMDense` weights rebuilt from the same seed and cast to float64, every rank's
batch of a step concatenated into one global batch; the loss is the mean BCE over it, the MLPs take
an SGD step and every table a dense row-wise Adagrad step (s += mean_j g^2 over the columns,
w -= lr g / (sqrt(s) + eps); rows without gradient keep their values and accumulators).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mgg.embedding.dlrm_data import DLRMBatches
from mgg.embedding.dlrm_model import DLRMConfig, DLRMDense
from mgg.embedding.init import init_table

__all__ = ["ReferenceDLRM"]


class ReferenceDLRM:
    """The float64 oracle of P ranks x B samples a step (it draws every rank's batches itself)."""

    def __init__(self, cfg: DLRMConfig, batch: int, world: int, eps: float = 1e-10):
        self.cfg, self.eps = cfg, eps
        self.tables = [init_table(n, cfg.dim, seed=cfg.seed + t, kind="uniform", dtype=torch.float64)
                       for t, n in enumerate(cfg.cards)]
        self.accum = [torch.zeros(n, dtype=torch.float64) for n in cfg.cards]
        torch.manual_seed(cfg.seed)
        self.dense = DLRMDense(cfg).double()
        self.streams = [DLRMBatches(cfg, batch, r) for r in range(world)]

    def step(self) -> float:
        """One step on the global batch; returns its mean loss."""
        parts = [s.next() for s in self.streams]
        dense = torch.cat([b.dense for b in parts]).double()
        ids = [torch.cat([b.ids[t] for b in parts]) for t in range(self.cfg.num_tables)]
        y = torch.cat([b.labels for b in parts]).double()
        w = [t.clone().requires_grad_() for t in self.tables]
        embs = [F.embedding(i, wt) for i, wt in zip(ids, w)]  # one id a bag: the sum is the row
        logit = self.dense.head(self.dense.bottom(dense), embs)
        loss = F.binary_cross_entropy_with_logits(logit, y)
        for p in self.dense.parameters():
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in self.dense.parameters():
                p -= self.cfg.lr * p.grad
            for t, wt in enumerate(w):
                g = wt.grad
                self.accum[t] += (g * g).mean(1)
                self.tables[t] -= self.cfg.emb_lr * g / (self.accum[t].sqrt() + self.eps).unsqueeze(1)
        return float(loss.detach())


def assert_trained_like(model, ref: "ReferenceDLRM", got: list[float], want: list[float], name: str) -> None:
    """A DLRM design after its steps against the float64 reference after the same steps: the
    losses (`got` vs `want`), every table (`model.table(t)`) and the MLP weights (`model.dense`)."""
    import pytest

    assert got == pytest.approx(want, rel=1e-5), name
    for t in range(len(ref.tables)):
        torch.testing.assert_close(model.table(t).double(), ref.tables[t], rtol=1e-4, atol=1e-6, msg=f"{name} table {t}")
    for p, q in zip(model.dense.parameters(), ref.dense.parameters()):
        torch.testing.assert_close(p.detach().double(), q.detach(), rtol=1e-4, atol=1e-6, msg=name)
