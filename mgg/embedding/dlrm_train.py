"""DLRM training over mgg's sharded tables: the step that examples/dlrm.py and bench/dlrm.py run.

One step (collective; every rank its own batch of B samples, the global batch is P * B):

    x = bottom MLP(dense)                              replicated MLPs
    embs = MultiTableEmbeddingBag(ids)                 all T tables in one lookup (unique rows
                                                       read from their owners)
    loss = BCE(top MLP(interaction(x, embs))) summed / (P * B)
    loss.backward()
    MLP gradients summed over the ranks (`mgg.nn.ddp.allreduce_gradients`: MPI on the CPU
    store, an on-stream NVSHMEM reduction on the GPU store), SGD step
    RowWiseAdagrad.step(): row gradients to their owners, row-wise Adagrad there

The summed-over-ranks loss is the mean over the global batch, so P ranks x B samples train like
one process with P * B samples.
"""
from __future__ import annotations

import torch

from ..nn.ddp import allreduce_gradients
from ..runtime.comm import Communicator
from ..runtime.store import SymmetricStore
from .bag import MultiTableEmbeddingBag
from .dlrm_data import DLRMBatch
from .dlrm_model import DLRMConfig, DLRMDense, dlrm_loss
from .optim import RowWiseAdagrad
from .table import TableConfig

__all__ = ["MggDLRM"]


class MggDLRM:
    """DLRM whose tables are one `MultiTableEmbeddingBag` (row-wise Adagrad at the owners).

    Args:
        cfg: the model and its learning rates.
        comm, store: the communicator and the symmetric store the tables live in.
        sharding: "range" (contiguous row blocks per rank) or "hash" (row g on rank g % P).
    """

    def __init__(self, cfg: DLRMConfig, comm: Communicator, store: SymmetricStore, sharding: str = "range"):
        self.cfg, self.comm, self.store = cfg, comm, store
        self.emb = MultiTableEmbeddingBag(
            [TableConfig(n, cfg.dim, "sum", sharding, f"C{t + 1}") for t, n in enumerate(cfg.cards)],
            comm, store, seed=cfg.seed, init="uniform")
        try:
            loc = self.emb.array.local
            self.device = loc.device
            torch.manual_seed(cfg.seed)  # the same MLP weights on every rank (and in every design)
            self.dense = DLRMDense(cfg).to(self.device)
            self.opt = torch.optim.SGD(self.dense.parameters(), lr=cfg.lr)
            self.emb_opt = RowWiseAdagrad(self.emb, lr=cfg.emb_lr)
        except BaseException:
            self.emb.free()
            raise

    def step(self, batch: DLRMBatch) -> torch.Tensor:
        """One training step on this rank's batch (on `self.device`); returns this rank's share
        of the global mean loss (a 0-dim tensor; the ranks' shares sum to the global loss)."""
        T, B = self.cfg.num_tables, batch.dense.shape[0]
        x = self.dense.bottom(batch.dense)
        embs = self.emb(batch.ids, [batch.offsets] * T)
        loss = dlrm_loss(self.dense.head(x, embs), batch.labels, B * self.comm.size)
        self.opt.zero_grad()
        loss.backward()
        allreduce_gradients(self.dense, self.comm, self.store)
        self.opt.step()
        self.emb_opt.step()
        return loss.detach()

    def table(self, t: int) -> torch.Tensor:
        """Collective: the full table t [N_t, D] on every rank."""
        return self.emb.gather_table(t)

    def free(self) -> None:
        """Collective: release the tables' symmetric array."""
        self.emb.free()
