"""The DLRM model (Naumov et al. 2019) over sharded embedding tables: its configuration and its dense part.

    bottom MLP: dense features [B, 13] -> x [B, D]
    T embedding bags (one id per sample and table, sum-pooled) -> e_1 .. e_T [B, D]
    dot interaction: the pairwise dot products of the T + 1 vectors (strictly lower triangle of
    [x, e_1, ..., e_T] [x, e_1, ..., e_T]^T), concatenated with x -> [B, D + (T+1)T/2]
    top MLP -> click logit [B]; loss = sum of BCE over the rank's samples / global batch.

The tables themselves are not here: `mgg.embedding.dlrm_train` holds them in a
`MultiTableEmbeddingBag`, the all-to-all baseline (bench/dlrm_a2a.py) in plain torch shards; both
take the same `DLRMConfig`, initial rows (`init_rows(rows, N_t, D, seed=seed + t, kind="uniform")`)
and `DLRMDense` weights (`torch.manual_seed(seed)` before building it), so they train the same model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CRITEO_KAGGLE", "NUM_DENSE", "DLRMConfig", "DLRMDense", "mlp", "interact", "dlrm_loss"]

#: the 26 categorical cardinalities of Criteo Kaggle (the DLRM repository's day-0 counts)
CRITEO_KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
                 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
NUM_DENSE = 13


@dataclass(frozen=True)
class DLRMConfig:
    """One DLRM training setup.

    Attributes:
        cards: rows of each table (T tables).
        dim: embedding width D (= the bottom MLP's output).
        bot: hidden sizes of the bottom MLP between the 13 inputs and D.
        top: sizes of the top MLP after the interaction, ending in 1.
        zipf: Zipf exponent of the synthetic ids.
        lr: SGD learning rate of the MLPs.
        emb_lr: row-wise Adagrad learning rate of the tables.
        seed: seeds the MLP weights, the tables (table t: seed + t) and the batches.
    """

    cards: tuple[int, ...]
    dim: int = 16
    bot: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (256, 64, 1)
    zipf: float = 1.05
    lr: float = 0.1
    emb_lr: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if not self.cards or min(self.cards) < 1:
            raise ValueError(f"DLRM needs at least one table, every one with >= 1 row; got {self.cards}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if not self.top or self.top[-1] != 1:
            raise ValueError(f"the top MLP must end in 1 (the logit), got {self.top}")
        if not (self.lr > 0 and self.emb_lr > 0):
            raise ValueError("lr and emb_lr must be > 0")

    @classmethod
    def criteo(cls, max_rows: int = 0, num_tables: int = 26, **kw) -> DLRMConfig:
        """The first `num_tables` Criteo Kaggle tables, each capped at `max_rows` (0: no cap)."""
        if not 1 <= num_tables <= len(CRITEO_KAGGLE):
            raise ValueError(f"num_tables must be in [1, {len(CRITEO_KAGGLE)}], got {num_tables}")
        cards = tuple(min(n, max_rows) if max_rows > 0 else n for n in CRITEO_KAGGLE[:num_tables])
        return cls(cards=cards, **kw)

    @property
    def num_tables(self) -> int:
        return len(self.cards)

    @property
    def bot_sizes(self) -> list[int]:
        return [NUM_DENSE, *self.bot, self.dim]

    @property
    def top_sizes(self) -> list[int]:
        t1 = self.num_tables + 1
        return [self.dim + t1 * (t1 - 1) // 2, *self.top]


def mlp(sizes: list[int]) -> torch.nn.Sequential:
    """Linear layers sizes[0] -> ... -> sizes[-1] with ReLU between them (none after the last)."""
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def interact(x: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
    """Dot interaction: x [B, D] and T pooled embeddings [B, D] -> [B, D + (T+1)T/2]."""
    t = torch.stack([x] + list(embs), dim=1)  # [B, T + 1, D]
    z = torch.bmm(t, t.transpose(1, 2))
    i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1, device=t.device)
    return torch.cat([x, z[:, i, j]], dim=1)


class DLRMDense(torch.nn.Module):
    """The replicated (data-parallel) part of DLRM: bottom MLP, interaction, top MLP."""

    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        self.bot = mlp(cfg.bot_sizes)
        self.top = mlp(cfg.top_sizes)

    def bottom(self, dense: torch.Tensor) -> torch.Tensor:
        """dense features [B, 13] float32 -> x [B, D]."""
        return self.bot(dense)

    def head(self, x: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        """x [B, D] and the pooled embeddings (T of [B, D]) -> logits [B]."""
        return self.top(interact(x, embs)).squeeze(1)


def dlrm_loss(logit: torch.Tensor, y: torch.Tensor, global_batch: int) -> torch.Tensor:
    """This rank's share of the mean BCE over the global batch: summed over the rank's samples,
    divided by the global batch, so the ranks' shares (and gradients) add up to the mean's."""
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="sum") / global_batch
