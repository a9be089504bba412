"""Seeded, layout-independent table initialization.

Table values are generated in fixed blocks of `BLOCK` rows, block b of table seed s from its own
`torch.Generator` seeded with `block_seed(s, b)`. Any rank can therefore produce exactly the rows it
owns (whatever the sharding and world size), and `init_table` builds the same full table for a
reference `torch.nn.EmbeddingBag.from_pretrained(init_table(...))`.

Kinds: ``normal`` (N(0, 1), torch.nn.EmbeddingBag's default), ``uniform`` (DLRM's
U(-sqrt(1/N), sqrt(1/N))), ``zeros``.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["INITS", "BLOCK", "block_seed", "init_rows", "init_table"]

INITS = ("normal", "uniform", "zeros")
BLOCK = 1 << 16


def block_seed(seed: int, block: int) -> int:
    return (int(seed) * 1_000_003 + int(block) * 7_919 + 12_345) % (1 << 62)


def _block(kind: str, seed: int, b: int, num_embeddings: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    n = min(BLOCK, num_embeddings - b * BLOCK)
    if kind == "zeros":
        return torch.zeros((n, dim), dtype=dtype)
    g = torch.Generator().manual_seed(block_seed(seed, b))
    if kind == "normal":
        return torch.randn((n, dim), generator=g, dtype=torch.float64).to(dtype)
    bound = float(np.sqrt(1.0 / num_embeddings))
    return (torch.rand((n, dim), generator=g, dtype=torch.float64) * (2 * bound) - bound).to(dtype)


def init_rows(rows: np.ndarray, num_embeddings: int, dim: int, *, seed: int = 0, kind: str = "normal",
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Initial values [len(rows), dim] of rows `rows` (int64, any order) of a table."""
    if kind not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {kind!r}")
    rows = np.asarray(rows, dtype=np.int64)
    out = torch.empty((len(rows), dim), dtype=dtype)
    if len(rows) == 0:
        return out
    blk = rows // BLOCK
    order = np.argsort(blk, kind="stable")
    bounds = np.flatnonzero(np.diff(blk[order])) + 1
    for grp in np.split(order, bounds):
        b = int(blk[grp[0]])
        vals = _block(kind, seed, b, num_embeddings, dim, dtype)
        out[torch.from_numpy(grp)] = vals[torch.from_numpy(rows[grp] - b * BLOCK)]
    return out


def init_table(num_embeddings: int, dim: int, *, seed: int = 0, kind: str = "normal",
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The full initial table [num_embeddings, dim] (what `init_rows` gives row by row)."""
    if kind not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {kind!r}")
    nb = -(-num_embeddings // BLOCK)
    return torch.cat([_block(kind, seed, b, num_embeddings, dim, dtype) for b in range(nb)]) if nb else torch.empty((0, dim), dtype=dtype)
