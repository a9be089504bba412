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

On the GPU store the step is replayed from a CUDA graph by default (`cuda_graph`;
mgg.embedding.dlrm_graphed): the same step in its capturable form, `train_step(..., fixed=True)`.
There the lookup records bad input on the device instead of raising: the step sums the ranks'
error flags with the MLP gradients and multiplies every gradient (MLP and rows) by "no rank had
an error", so a step with bad input writes nothing, and the error is raised after it. The MLP update is plain SGD without momentum written as one foreach add (what torch.optim.SGD
computes), in both forms.
"""
from __future__ import annotations

import torch

from ..nn.ddp import allreduce_gradients
from ..runtime.comm import Communicator
from ..runtime.store import SymmetricStore
from .bag import MultiTableEmbeddingBag
from .dlrm_data import DLRMBatch
from .dlrm_graphed import GraphedDLRMStep
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
        cuda_graph: replay the step from a CUDA graph (`GraphedDLRMStep`); None: on for the GPU
            store, off on the CPU. True on the CPU store is refused.
        warmup: eager steps before the capture.
    Attributes:
        graphed: the `GraphedDLRMStep` (what ran: captured, replays, eager_steps, why_eager), or None.
    """

    def __init__(self, cfg: DLRMConfig, comm: Communicator, store: SymmetricStore, sharding: str = "range",
                 cuda_graph: bool | None = None, warmup: int = 2):
        self.cfg, self.comm, self.store = cfg, comm, store
        self.emb = MultiTableEmbeddingBag(
            [TableConfig(n, cfg.dim, "sum", sharding, f"C{t + 1}") for t, n in enumerate(cfg.cards)],
            comm, store, seed=cfg.seed, init="uniform")
        try:
            loc = self.emb.array.local
            self.device = loc.device
            if cuda_graph and self.device.type != "cuda":
                raise ValueError("MggDLRM: cuda_graph=True needs the GPU store")
            torch.manual_seed(cfg.seed)  # the same MLP weights on every rank (and in every design)
            self.dense = DLRMDense(cfg).to(self.device)
            self.emb_opt = RowWiseAdagrad(self.emb, lr=cfg.emb_lr)
            on = self.device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
            self.graphed = GraphedDLRMStep(self.train_step, self.emb, comm, warmup) if on else None
        except BaseException:
            self.emb.free()
            raise

    def step(self, batch: DLRMBatch) -> torch.Tensor:
        """One training step on this rank's batch (on `self.device`); returns this rank's share
        of the global mean loss (a 0-dim tensor; the ranks' shares sum to the global loss)."""
        if self.graphed is not None:
            return self.graphed(batch)
        return self.train_step(batch.dense, batch.ids, batch.offsets, batch.labels)

    def train_step(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: torch.Tensor, labels: torch.Tensor,
                   fixed: bool = False) -> torch.Tensor:
        """The step on dense float32 [B, 13], T id tensors [B], offsets [B] and labels float32 [B];
        fixed: its capturable form (no host read; the tables' module in its capture mode, see
        mgg.embedding.dlrm_graphed). Returns the loss share (0-d)."""
        T, B = self.cfg.num_tables, dense.shape[0]
        self.dense.zero_grad(set_to_none=True)
        x = self.dense.bottom(dense)
        embs = self.emb(ids, [offsets] * T)
        loss = dlrm_loss(self.dense.head(x, embs), labels, B * self.comm.size)
        loss.backward()
        flag = self.emb.input_error_flag() if fixed else None
        bad = allreduce_gradients(self.dense, self.comm, self.store, extra=flag)
        params = [p for p in self.dense.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        with torch.no_grad():
            if fixed:  # bad input on any rank holds every rank's update; the error is raised after the step
                keep = (torch.as_tensor(bad, device=self.device) == 0).to(torch.float32)
                torch._foreach_mul_(grads, keep)
                self.emb.scale_gradients_(keep)
            torch._foreach_add_(params, grads, alpha=-self.cfg.lr)  # SGD without momentum: p -= lr * grad
        self.emb_opt.step(fixed=fixed)
        return loss.detach()

    def table(self, t: int) -> torch.Tensor:
        """Collective: the full table t [N_t, D] on every rank."""
        return self.emb.gather_table(t)

    def free(self) -> None:
        """Collective: release the step's graph, then the tables' symmetric array."""
        if self.graphed is not None:
            self.graphed.close()
        self.emb.free()
