"""How an epoch's training nodes become steps: global batches, and each rank's share of them.

Data-parallel mini-batch training over P ranks with a per-rank batch size B (as in WholeGraph's,
DGL's and PyG's multi-GPU examples, `--batch-size` counts seeds per rank and step):

    global batch   G = P * B seeds per step
    steps          S = ceil(n / G)   (drop_last: floor(n / G))        n = training nodes, all ranks
    epoch order    one permutation of the n training nodes, drawn from (seed, epoch) alone, so
                   every rank draws the same one
    global batch s positions [g_s, g_{s+1}) of that order, g_s = floor(s * n / S): S nearly equal
                   batches (sizes differ by at most 1; drop_last: exactly G each)
    rank r's share the r-th of P nearly equal contiguous parts of global batch s (<= B seeds)

The global batch of step s therefore depends on (n, G, seed, epoch) only, not on P: P = 1 with
`batch_size = 2b` and P = 2 with `batch_size = b` train on the same batches. Every rank has S
steps; a share can be empty (a global batch of fewer than P seeds), and such a rank still takes
part in every step's collectives.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = ["BatchPlan", "epoch_order", "seeds_fingerprint"]


@dataclass(frozen=True)
class BatchPlan:
    """The step layout of an epoch (see the module doc). Plain arithmetic, the same on every rank.

    Attributes:
        num_seeds: n, the training nodes of all ranks together.
        batch_size: B, seeds per rank and step (>= 1).
        world_size: P. rank: this rank.
        drop_last: only full global batches (the last n mod G seeds of the order are left out).
    """

    num_seeds: int
    batch_size: int
    world_size: int = 1
    rank: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} out of range for {self.world_size} ranks")
        if self.num_seeds < 0:
            raise ValueError(f"num_seeds must be >= 0, got {self.num_seeds}")

    @property
    def global_batch_size(self) -> int:
        """G = P * B: seeds per step over all ranks (the last global batches may hold fewer)."""
        return self.world_size * self.batch_size

    @property
    def steps(self) -> int:
        """S: steps per epoch, the same on every rank."""
        g = self.global_batch_size
        return self.num_seeds // g if self.drop_last else -(-self.num_seeds // g)

    def global_bounds(self) -> np.ndarray:
        """int64 [S + 1]: global batch s is positions [b[s], b[s+1]) of the epoch order."""
        s = self.steps
        if self.drop_last:
            return np.arange(s + 1, dtype=np.int64) * self.global_batch_size
        return (np.arange(s + 1, dtype=np.int64) * self.num_seeds) // max(s, 1)

    def global_sizes(self) -> np.ndarray:
        """int64 [S]: seeds of every global batch."""
        return np.diff(self.global_bounds())

    def shares(self) -> np.ndarray:
        """int64 [S, 2]: this rank's [lo, hi) positions of the epoch order at every step."""
        b = self.global_bounds()
        size = b[1:] - b[:-1]
        lo = b[:-1] + (size * self.rank) // self.world_size
        hi = b[:-1] + (size * (self.rank + 1)) // self.world_size
        return np.stack([lo, hi], axis=1)

    @property
    def max_share(self) -> int:
        """The most seeds any rank has in one step (<= B)."""
        size = self.global_sizes()
        return int(-(-size.max() // self.world_size)) if size.size else 0


def epoch_order(num_seeds: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """int64 [n]: the epoch's order of the training nodes (positions into the seed array), drawn
    from (seed, epoch) only, so every rank draws the same; the identity without `shuffle`."""
    if not shuffle:
        return np.arange(num_seeds, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)]))
    return rng.permutation(num_seeds).astype(np.int64, copy=False)


def seeds_fingerprint(seeds: np.ndarray) -> str:
    """A digest of the seed array (values and order): ranks compare it to check that they were
    given the same training nodes."""
    a = np.ascontiguousarray(seeds, dtype=np.int64)
    return hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest() + f":{len(a)}"
