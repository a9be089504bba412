"""Fused-Map (FastGL): deduplicate sampled ids and build the global -> local id map in one pass.

Given the ids of one sampling hop, `ids = [dst nodes (unique, the "seeds" of the hop), sampled
neighbors...]` (int64 [M]), the hop needs

    n_id  int64 [U]: the distinct ids, seeds first in their order, the others in order of first
                     occurrence (n_id[:n_seeds] == ids[:n_seeds]);
    local int64 [M]: local[i] = position of ids[i] in n_id  (so n_id[local] == ids).

The usual way is a chain of sorts: `torch.unique(return_inverse)` (a sort), a scatter-min of the
first occurrence, an argsort by it, and a relabel (`unique_map`, kept as the baseline). Fused-Map
replaces the chain by one insertion pass into an open-addressing hash table keyed by id whose
value is the smallest position the id occurs at, followed by prefix sums only:

    1. insert every ids[i] (linear probing; the slot's value becomes min(value, i));
    2. first[i]  = (value of ids[i]'s slot == i)      -- i is the id's first occurrence
    3. n_id      = ids[first]                          -- compaction, first-occurrence order
    4. local[i]  = cumsum(first)[value of ids[i]'s slot] - 1

No sort at all; seeds come first because they are the first n_seeds entries and unique. The GPU
kernel (`mgg.kernels.sample_gpu.fused_map_cuda`) does step 1 with atomicCAS/atomicMin per thread;
the CPU version below runs the same table with numpy, all pending keys probing in lock-step rounds
(a round inserts every key whose probe slot is empty or holds its own id; colliding keys move one
slot on). A key's rounds equal its probe length, O(1) expected at load factor <= 1/2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

__all__ = ["IdMap", "build_id_map", "fused_map", "unique_map", "hash_insert"]

_EMPTY = np.int64(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing multiplier


@dataclass
class IdMap:
    """The id map of one hop.

    Attributes:
        n_id: int64 [U] distinct global ids, seeds first (n_id[:n_seeds] == seeds).
        local: list of int64 tensors, local[k][j] = position of nbrs_list[k][j] in n_id.
        n_seeds: B, the number of seeds.
    """

    n_id: torch.Tensor
    local: list[torch.Tensor]
    n_seeds: int

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.numel())


def _check_ids(ids, n_seeds: int) -> None:
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if ids.dtype != torch.int64:
        raise TypeError(f"ids must be int64, got {ids.dtype}")
    if not 0 <= n_seeds <= ids.numel():
        raise ValueError(f"n_seeds must be in [0, {ids.numel()}], got {n_seeds}")


def hash_insert(keys: np.ndarray, capacity: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Insert int64 `keys` [M] (>= 0) into an open-addressing table; vectorised linear probing.

    Returns:
        (table_key int64 [S], table_min int64 [S], slot int64 [M]): the key of every slot (-1 when
        empty), the smallest i with keys[i] in that slot, and the slot of every keys[i].
    """
    m = int(keys.shape[0])
    if capacity is None:
        capacity = 1 << max(4, int(2 * max(m, 1) - 1).bit_length())  # power of 2 >= 2M
    bits = capacity.bit_length() - 1
    mask = np.int64(capacity - 1)
    table_key = np.full(capacity, _EMPTY, dtype=np.int64)
    table_min = np.full(capacity, np.iinfo(np.int64).max, dtype=np.int64)
    slot = np.empty(m, dtype=np.int64)
    if m == 0:
        return table_key, table_min, slot
    with np.errstate(over="ignore"):
        h = ((keys.astype(np.uint64) * _GOLDEN) >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(m, np.int64)
    pending = np.arange(m, dtype=np.int64)
    probe = h
    while pending.size:
        s = probe & mask
        k = keys[pending]
        cur = table_key[s]
        empty = cur == _EMPTY
        # claim empty slots: one writer wins per slot (whichever; as atomicCAS), others re-read
        table_key[s[empty]] = k[empty]
        cur = table_key[s]
        hit = cur == k
        done = pending[hit]
        slot[done] = s[hit]
        np.minimum.at(table_min, s[hit], done)
        pending, probe = pending[~hit], s[~hit] + 1
    return table_key, table_min, slot


def fused_map(ids: torch.Tensor, n_seeds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicate `ids` and map them to local positions in one hash pass (see module doc).

    Args:
        ids: int64 [M], non-negative; ids[:n_seeds] are the seeds and must be unique.
        n_seeds: B.
    Returns:
        n_id int64 [U] (seeds first, the rest in first-occurrence order) and local int64 [M] with
        n_id[local] == ids. CUDA input goes to `mgg.kernels.sample_gpu.fused_map_cuda`.
    Raises:
        ValueError when the seeds repeat or ids are negative.
    """
    _check_ids(ids, n_seeds)
    if ids.is_cuda:
        from ..kernels.sample_gpu import fused_map_cuda

        return fused_map_cuda(ids, n_seeds)
    a = ids.numpy()
    if a.size and a.min() < 0:
        raise ValueError(f"ids must be non-negative, found {int(a.min())}")
    _, table_min, slot = hash_insert(a)
    firstpos = table_min[slot]                  # first occurrence of every ids[i]
    first = firstpos == np.arange(a.size)
    if n_seeds and not first[:n_seeds].all():
        j = int(np.flatnonzero(~first[:n_seeds])[0])
        raise ValueError(f"seeds must be unique: seed {int(a[j])} repeats (position {j})")
    rank = np.cumsum(first, dtype=np.int64) - 1
    return torch.from_numpy(a[first]), torch.from_numpy(rank[firstpos])


def unique_map(ids: torch.Tensor, n_seeds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline of `fused_map` with a sort chain: unique(return_inverse) -> scatter-min of the first
    occurrence -> argsort -> relabel. Same output as `fused_map` (any device)."""
    _check_ids(ids, n_seeds)
    m = ids.numel()
    uniq, inv = torch.unique(ids, return_inverse=True)
    pos = torch.arange(m, device=ids.device)
    first = torch.full((uniq.numel(),), m, dtype=torch.int64, device=ids.device)
    first.scatter_reduce_(0, inv, pos, reduce="amin")
    order = torch.argsort(first)
    if n_seeds and not bool((first[order[:n_seeds]] == pos[:n_seeds]).all()):
        raise ValueError("seeds must be unique")
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=ids.device)
    return uniq[order], rank[inv]


def build_id_map(seeds: torch.Tensor, nbrs_list: Sequence[torch.Tensor], method: str = "fused") -> IdMap:
    """The id map of `seeds` (unique, int64 [B]) and the neighbor id tensors of `nbrs_list`.

    Args:
        method: "fused" (hash table, `fused_map`) or "unique" (sort chain, `unique_map`).
    """
    if method not in ("fused", "unique"):
        raise ValueError(f"method must be 'fused' or 'unique', got {method!r}")
    parts = [seeds.to(torch.int64)] + [t.to(torch.int64) for t in nbrs_list]
    ids = torch.cat(parts) if len(parts) > 1 else parts[0]
    fn = fused_map if method == "fused" else unique_map
    n_id, local = fn(ids, int(seeds.numel()))
    sizes = [int(t.numel()) for t in nbrs_list]
    locals_ = list(torch.split(local[seeds.numel():], sizes)) if sizes else []
    return IdMap(n_id, locals_, int(seeds.numel()))
