"""Synthetic Criteo-shaped DLRM batches: 13 dense features, one Zipf-distributed id per table,
click labels drawn from a fixed hidden teacher (so the loss can fall).

Rank r's stream of batches is `DLRMBatches(cfg, batch, rank)`: seeded by (cfg.seed, rank), so
every training design fed from it sees the same samples in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .dlrm_model import NUM_DENSE, DLRMConfig

__all__ = ["zipf_ids", "teacher", "DLRMBatch", "DLRMBatches"]


def zipf_ids(rng: np.random.Generator, n: int, size: int, s: float) -> np.ndarray:
    """int64 [size]: bounded Zipf(s) ranks in [0, n), scattered over the id space (hot ids are
    not all on one shard)."""
    if n <= 1 << 20:
        p = np.arange(1, n + 1, dtype=np.float64) ** -s
        k = rng.choice(n, size=size, p=p / p.sum())
    else:  # inverse CDF of the continuous approximation
        u = rng.random(size)
        k = np.minimum((np.exp(u * np.log(n + 1)) - 1).astype(np.int64), n - 1) if s == 1.0 else \
            np.minimum(((u * ((n + 1) ** (1 - s) - 1) + 1) ** (1 / (1 - s)) - 1).astype(np.int64), n - 1)
    return (np.asarray(k, dtype=np.int64) * 2654435761) % n


def teacher(t: int, ids: np.ndarray) -> np.ndarray:
    """A fixed hidden effect in [-1, 1) of every (table t, id)."""
    return (((ids * 0x9E3779B1 + t * 0x85EBCA6B) >> 7) % 1000) / 500.0 - 1.0


@dataclass
class DLRMBatch:
    """One rank's batch of B samples.

    dense: float32 [B, 13]; ids: T int64 tensors [B] (one id per sample and table);
    offsets: int64 [B] (arange: one id per bag); labels: float32 [B] in {0, 1}."""

    dense: torch.Tensor
    ids: list[torch.Tensor]
    offsets: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device | str) -> DLRMBatch:
        return DLRMBatch(self.dense.to(device), [i.to(device) for i in self.ids], self.offsets.to(device),
                         self.labels.to(device))


class DLRMBatches:
    """Rank `rank`'s batches of `batch` samples each (call `next()` for the next one)."""

    def __init__(self, cfg: DLRMConfig, batch: int, rank: int):
        if batch < 1:
            raise ValueError(f"batch size must be >= 1, got {batch}")
        self.cfg, self.batch = cfg, int(batch)
        self.rng = np.random.default_rng(cfg.seed * 1000 + rank + 1)
        self.w_dense = np.random.default_rng(1234).standard_normal(NUM_DENSE) * 0.5
        self.offsets = torch.arange(self.batch)

    def next(self) -> DLRMBatch:
        B, rng = self.batch, self.rng
        dense = rng.standard_normal((B, NUM_DENSE)).astype(np.float32)
        ids = [zipf_ids(rng, n, B, self.cfg.zipf) for n in self.cfg.cards]
        score = dense @ self.w_dense + sum(teacher(t, i) for t, i in enumerate(ids[:8])) * 0.8
        y = (rng.random(B) < 1 / (1 + np.exp(-score))).astype(np.float32)
        return DLRMBatch(torch.from_numpy(dense), [torch.from_numpy(i) for i in ids], self.offsets,
                         torch.from_numpy(y))
