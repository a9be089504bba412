"""Random sampled blocks and their dense float64 matrices, for tests of the block convolutions."""
from __future__ import annotations

import numpy as np
import torch

from ..sample.block import Block

__all__ = ["random_block", "block_dense"]


def random_block(n_dst: int, n_src: int, max_deg: int, seed: int, device: torch.device | str = "cpu",
                 isolated: int = 2) -> Block:
    """A Block with n_dst dst rows of 0..max_deg sampled edges each (the first `isolated` rows
    none, some src ids repeated within a row), src ids uniform in [0, n_src), and graph degrees
    (`src_degree`) of 0..3 max_deg, at least each dst row's sampled edges."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_deg + 1, n_dst)
    deg[: min(isolated, n_dst)] = 0
    ptr = np.zeros(n_dst + 1, np.int64)
    np.cumsum(deg, out=ptr[1:])
    col = rng.integers(0, n_src, int(ptr[-1])).astype(np.int64)
    if col.size > 1:
        col[1] = col[0]  # a repeated src in the row holding edges 0 and 1 (or across two rows)
    degree = rng.integers(0, 3 * max_deg + 1, n_src).astype(np.int64)
    degree[:n_dst] = np.maximum(degree[:n_dst], deg)
    return Block(torch.from_numpy(ptr).to(device), torch.from_numpy(col).to(device), n_src, n_dst,
                 src_degree=torch.from_numpy(degree).to(device))


def block_dense(block: Block) -> np.ndarray:
    """float64 [n_dst, n_src]: how many sampled edges join dst i to src j."""
    a = np.zeros((block.n_dst, block.n_src))
    np.add.at(a, (block.row.cpu().numpy(), block.col.cpu().numpy()), 1.0)
    return a
