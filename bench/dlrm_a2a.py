"""The all-to-all DLRM baseline of bench/dlrm.py: the design a user writes with torch.distributed alone.

Tables are sharded row-wise, as mgg's "range" sharding: rank r holds rows
[r * n_t, min(N_t, (r + 1) * n_t)) of table t, n_t = ceil(N_t / P), in one local tensor
[sum_t n_t, D] (table after table) with one row-wise Adagrad accumulator per row. Row-wise, not
table-wise: the 26 Criteo tables span 3 to 10M rows, so whole tables per rank cannot balance
memory or traffic at P = 2..8, while row blocks give every rank 1/P of every table (TorchRec's
choice for large tables); it is also the layout mgg's tables use, so both designs hold and move
the same rows.

One step, every rank its own batch (torch.distributed: NCCL on the GPU, gloo on the CPU):

    forward:  keys of all tables (table offset + id) -> unique keys; owner and local row of each;
              sorted by owner; all_to_all_single of the counts (one host read of the split
              sizes), of the local rows; owners index_select their rows; all_to_all_single of
              the rows back; F.embedding_bag (sum) over the received unique rows
    backward: autograd to the unique rows; all_to_all_single of their gradients to the owners
              (the forward's splits reversed); owners sum duplicates (index_add) and apply
              row-wise Adagrad; the MLP gradients in one flat all_reduce, SGD step.

Only the initial values come from mgg (`mgg.embedding.init.init_rows`, a seeded generator), so
both designs start from the same tables; exchange, lookup, pooling, gradient and update are
plain torch.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from mgg.embedding.dlrm_data import DLRMBatch
from mgg.embedding.dlrm_model import DLRMConfig, DLRMDense, dlrm_loss
from mgg.embedding.init import init_rows

__all__ = ["AllToAllDLRM"]


class AllToAllDLRM:
    """DLRM with row-wise sharded tables exchanged by torch.distributed all-to-all (see module doc).

    Needs an initialised default process group; `device` is where the tables and MLPs live.
    """

    def __init__(self, cfg: DLRMConfig, device: torch.device, eps: float = 1e-10):
        self.cfg, self.device, self.eps = cfg, torch.device(device), float(eps)
        self.P, self.rank = tdist.get_world_size(), tdist.get_rank()
        P, r = self.P, self.rank
        cards = np.asarray(cfg.cards, dtype=np.int64)
        slice_rows = -(-cards // P)
        base = np.concatenate([[0], np.cumsum(slice_rows)])
        weight = torch.zeros((int(base[-1]), cfg.dim), dtype=torch.float32)
        for t, n in enumerate(cfg.cards):
            rows = np.arange(r * slice_rows[t], min(n, (r + 1) * slice_rows[t]), dtype=np.int64)
            weight[int(base[t]): int(base[t]) + len(rows)] = init_rows(rows, n, cfg.dim, seed=cfg.seed + t,
                                                                       kind="uniform")
        self.weight = weight.to(self.device)
        self.accum = torch.zeros(int(base[-1]), dtype=torch.float32, device=self.device)
        dev = self.device
        self.table_offset = torch.from_numpy(np.concatenate([[0], np.cumsum(cards)])).to(dev)
        self.slice_rows = torch.from_numpy(slice_rows).to(dev)
        self.base = torch.from_numpy(base[:-1]).to(dev)
        torch.manual_seed(cfg.seed)  # the same MLP weights on every rank (and in every design)
        self.dense = DLRMDense(cfg).to(dev)
        self.opt = torch.optim.SGD(self.dense.parameters(), lr=cfg.lr)

    # -- the exchange ---------------------------------------------------------------------------
    def _a2a(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
        out = torch.empty((sum(recv_splits),) + tuple(send.shape[1:]), dtype=send.dtype, device=send.device)
        tdist.all_to_all_single(out, send.contiguous(), recv_splits, send_splits)
        return out

    def _lookup(self, keys: torch.Tensor):
        """Unique keys' rows from their owners: (rows [U, D] in unique-key order, inverse [n] of
        every key into them, and what the backward needs: the owner order and split sizes, the
        local rows this rank served)."""
        uniq, inv = torch.unique(keys, return_inverse=True)
        t = torch.searchsorted(self.table_offset, uniq, right=True) - 1
        row = uniq - self.table_offset[t]
        n_t = self.slice_rows[t]
        owner = row // n_t
        local = self.base[t] + row - owner * n_t
        owner, order = torch.sort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=self.P)
        recv_counts = torch.empty_like(send_counts)
        tdist.all_to_all_single(recv_counts, send_counts)
        splits = torch.stack([send_counts, recv_counts]).tolist()  # the one host synchronisation
        sent, recv = splits[0], splits[1]
        wanted = self._a2a(local[order], sent, recv)  # local rows others want from me
        got = self._a2a(self.weight.index_select(0, wanted), recv, sent)
        rows = torch.empty_like(got)
        rows[order] = got
        return rows, inv, (order, sent, recv, wanted)

    # -- one step -------------------------------------------------------------------------------
    def step(self, batch: DLRMBatch) -> torch.Tensor:
        """One training step on this rank's batch (on `self.device`); returns this rank's share
        of the global mean loss (0-dim; the ranks' shares sum to the global loss)."""
        T, B = self.cfg.num_tables, batch.dense.shape[0]
        keys = torch.cat([batch.ids[t] + self.table_offset[t] for t in range(T)])
        rows, inv, (order, sent, recv, wanted) = self._lookup(keys)
        rows.requires_grad_()
        x = self.dense.bottom(batch.dense)
        n = [int(i.numel()) for i in batch.ids]
        pos = np.concatenate([[0], np.cumsum(n)])
        embs = [F.embedding_bag(inv[pos[t]: pos[t + 1]], rows, batch.offsets, mode="sum") for t in range(T)]
        loss = dlrm_loss(self.dense.head(x, embs), batch.labels, B * self.P)
        self.opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in self.dense.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        tdist.all_reduce(flat)
        off = 0
        for g in grads:
            g.copy_(flat[off: off + g.numel()].view_as(g))
            off += g.numel()
        self.opt.step()
        g_back = self._a2a(rows.grad[order], sent, recv)  # each unique row's gradient to its owner
        self._adagrad(wanted, g_back)
        return loss.detach()

    @torch.no_grad()
    def _adagrad(self, local_rows: torch.Tensor, grad: torch.Tensor) -> None:
        """Row-wise Adagrad on my rows: s[r] += mean_j G[r, j]^2; w[r] -= lr G[r] / (sqrt(s[r]) + eps),
        G the summed gradient of each distinct row."""
        rows, inv = torch.unique(local_rows, return_inverse=True)
        g = torch.zeros((len(rows), grad.shape[1]), dtype=grad.dtype, device=grad.device).index_add_(0, inv, grad)
        s = self.accum.index_select(0, rows) + (g * g).mean(1)
        self.accum.index_copy_(0, rows, s)
        self.weight.index_add_(0, rows, g * (-self.cfg.emb_lr / (s.sqrt() + self.eps)).unsqueeze(1))

    def table(self, t: int) -> torch.Tensor:
        """Collective: the full table t [N_t, D] on every rank (all_gather of the row blocks)."""
        n, r0 = int(self.cfg.cards[t]), int(self.base[t])
        n_t = int(self.slice_rows[t])
        mine = self.weight[r0: r0 + n_t].contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.P)]
        tdist.all_gather(parts, mine)
        return torch.cat(parts)[:n].cpu()
