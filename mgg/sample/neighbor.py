"""Uniform neighbor sampling without replacement over a CSR graph (one hop, one fanout).

`sample_neighbors(indptr, indices, seeds, fanout, generator)` picks, for every seed, min(deg, fanout)
distinct *edge positions* of its CSR row uniformly at random without replacement (fanout == -1:
the whole row). Edge positions, not neighbor ids, are what is drawn: a graph with a duplicate edge
j -> i has two positions for it, and both can be sampled, exactly as in PyG/DGL.

The CPU path is vectorised torch, exact (every k-subset of a row is equally likely), in two
regimes picked per seed:

* "keys" (deg <= KEYS_FACTOR * fanout): a uniformly random permutation of all candidate edges
  (`torch.randperm`), then a stable sort by seed: within each seed the edges are in uniformly
  random order, and the first `fanout` are kept. Cost O(sum of degrees) for these seeds.
* "rejection" (deg > KEYS_FACTOR * fanout, hubs): `fanout` uniform draws from [0, deg) per seed,
  duplicates dropped, the deficit redrawn until every seed has `fanout` distinct positions. Each
  round draws exactly the missing count, so this is the sequential "draw, skip repeats, stop at k
  distinct" process whose result is invariant under permutations of the row, i.e. a uniform
  k-subset. Cost O(fanout) per seed whatever the degree (few rounds: at most 1/KEYS_FACTOR of the
  draws repeat on average).

When `indptr` is a CUDA tensor the call goes to `mgg.kernels.sample_gpu.sample_neighbors_cuda`
(same contract; `indices` is then a CUDA tensor or a pinned host tensor read zero-copy, see
`place_adjacency` and docs/sampling.md).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["sample_neighbors", "sample_edge_positions", "check_fanouts", "place_adjacency", "kernel_seed",
           "KEYS_FACTOR"]

#: degree / fanout ratio above which a seed is sampled by rejection instead of random keys
KEYS_FACTOR = 4


def check_fanouts(fanouts: Sequence[int] | int, what: str = "fanouts") -> list[int]:
    """Validate per-layer fanouts: a non-empty list of ints, each >= 1 or exactly -1 (all).

    Raises:
        ValueError naming `what` and the offending entry (also for non-integers).
    """
    if isinstance(fanouts, (int, np.integer)) and not isinstance(fanouts, bool):
        fanouts = [int(fanouts)]
    try:
        vals = list(fanouts)
    except TypeError:
        raise ValueError(f"{what} must be a list of integers, got {type(fanouts).__name__}") from None
    if not vals:
        raise ValueError(f"{what} must hold at least one fanout (one per layer), got an empty list")
    out = []
    for i, f in enumerate(vals):
        if isinstance(f, bool) or not isinstance(f, (int, np.integer)):
            raise ValueError(f"{what}[{i}] must be an integer, got {f!r}")
        f = int(f)
        if f < 1 and f != -1:
            raise ValueError(f"{what}[{i}] must be a positive integer or -1 (all neighbors), got {f}")
        out.append(f)
    return out


def _as_long(a, name: str) -> torch.Tensor:
    t = torch.as_tensor(a) if not isinstance(a, torch.Tensor) else a
    if t.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor/array, got dtype {t.dtype}")
    return t.to(torch.int64)


def _check_inputs(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor) -> None:
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError("indptr must be 1-D with N + 1 >= 1 entries")
    if indices.dim() != 1:
        raise ValueError("indices must be 1-D")
    if seeds.dim() != 1:
        raise ValueError(f"seeds must be 1-D, got shape {tuple(seeds.shape)}")
    n = indptr.numel() - 1
    if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= n):
        bad = int(seeds.min()) if int(seeds.min()) < 0 else int(seeds.max())
        raise IndexError(f"seeds out of range [0, {n}): found {bad}")


def sample_edge_positions(indptr, indices, seeds, fanout: int,
                          generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU sampler core: edge *positions* (indices into `indices`) instead of neighbor ids.

    Args:
        indptr: int64 [N + 1] CSR row pointer (rows = targets; numpy or torch, CPU).
        indices: int64 [E] neighbor ids (only its length is used here).
        seeds: int64 [B] nodes to sample for (repeats allowed: sampled independently).
        fanout: >= 1, or -1 for every edge of the row.
        generator: CPU torch.Generator (None: torch's default generator).
    Returns:
        ptr int64 [B + 1] (ptr[b+1] - ptr[b] = min(deg(seeds[b]), fanout)) and eid int64 [ptr[-1]]:
        the sampled positions of seed b in eid[ptr[b]:ptr[b+1]], distinct, in random order.
    """
    (fanout,) = check_fanouts([fanout], "fanout")
    indptr = _as_long(indptr, "indptr")
    indices = torch.as_tensor(indices)
    seeds = _as_long(seeds, "seeds")
    _check_inputs(indptr, indices, seeds)
    start = indptr[seeds]
    deg = indptr[seeds + 1] - start
    cnt = deg if fanout == -1 else torch.clamp(deg, max=fanout)
    ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64)
    torch.cumsum(cnt, 0, out=ptr[1:])
    total = int(ptr[-1])
    if total == 0:
        return ptr, torch.zeros(0, dtype=torch.int64)
    full = deg == cnt                                     # the whole row
    hub = (~full) & (deg > KEYS_FACTOR * fanout)          # rejection sampling
    keys = (~full) & (~hub)                               # random keys
    segs, poss = [], []
    for mask in (full, keys):
        sel = torch.nonzero(mask).flatten()
        if sel.numel() == 0:
            continue
        seg, pos, first = _expand_rows(sel, start, deg)
        if mask is keys:
            # uniformly random order inside each seed: a random permutation, then a stable sort by
            # seed; keep the first `fanout` of every seed
            perm = torch.randperm(pos.numel(), generator=generator)
            order = perm[torch.sort(seg[perm], stable=True).indices]
            seg, pos = seg[order], pos[order]
            take = (torch.arange(seg.numel()) - torch.repeat_interleave(first[:-1], deg[sel])) < fanout
            seg, pos = seg[take], pos[take]
        segs.append(seg)
        poss.append(pos)
    sel = torch.nonzero(hub).flatten()
    if sel.numel():
        seg, pos = _rejection(sel, start, deg, fanout, generator)
        segs.append(seg)
        poss.append(pos)
    seg, pos = torch.cat(segs), torch.cat(poss)
    return ptr, pos[torch.sort(seg, stable=True).indices]


def _expand_rows(sel: torch.Tensor, start: torch.Tensor, deg: torch.Tensor):
    """(seed slot, edge position) of every edge of the rows `sel`, and the row offsets [k + 1]."""
    d = deg[sel]
    first = torch.zeros(sel.numel() + 1, dtype=torch.int64)
    torch.cumsum(d, 0, out=first[1:])
    seg = torch.repeat_interleave(sel, d)
    off = torch.arange(int(first[-1]), dtype=torch.int64) - torch.repeat_interleave(first[:-1], d)
    return seg, start[seg] + off, first


def _rejection(sel: torch.Tensor, start: torch.Tensor, deg: torch.Tensor, fanout: int,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`fanout` distinct positions for each seed slot in `sel` (deg > fanout), by redrawing repeats.

    Draws live in a virtual concatenation of the selected rows (slot k owns [vstart[k],
    vstart[k] + deg)), so repeated seeds are sampled independently and one `unique` finds the
    repeats of every slot at once.
    """
    d = deg[sel]
    vstart = torch.zeros(sel.numel() + 1, dtype=torch.int64)
    torch.cumsum(d, 0, out=vstart[1:])
    got = torch.zeros(0, dtype=torch.int64)
    need = torch.full((sel.numel(),), fanout, dtype=torch.int64)
    while True:
        todo = torch.nonzero(need > 0).flatten()
        if todo.numel() == 0:
            break
        who = torch.repeat_interleave(todo, need[todo])
        u = torch.rand(who.numel(), dtype=torch.float64, generator=generator)
        draw = vstart[who] + torch.minimum((u * d[who]).long(), d[who] - 1)
        got = torch.unique(torch.cat([got, draw]))
        slot = torch.searchsorted(vstart, got, right=True) - 1
        need = fanout - torch.bincount(slot, minlength=sel.numel())
    slot = torch.searchsorted(vstart, got, right=True) - 1
    # positions come out sorted per slot; shuffle inside each slot so the order is random too
    perm = torch.randperm(got.numel(), generator=generator)
    order = perm[torch.sort(slot[perm], stable=True).indices]
    slot, got = slot[order], got[order]
    return sel[slot], start[sel[slot]] + (got - vstart[slot])


def kernel_seed(generator: torch.Generator | None) -> int:
    """The 62-bit seed of one GPU sampling launch, drawn from the (CPU) generator: one draw per
    hop, so a seeded generator gives the same batches on every run."""
    return int(torch.randint(0, 2**62, (1,), generator=generator).item())


def sample_neighbors(indptr, indices, seeds, fanout: int,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop of uniform neighbor sampling without replacement.

    Args:
        indptr: int64 [N + 1] CSR row pointer (row i lists the sources j of edges j -> i).
        indices: int64 [E] global neighbor ids.
        seeds: int64 [B] global ids of the nodes to sample for.
        fanout: neighbors per seed (>= 1), or -1 for all of them.
        generator: torch.Generator driving the draws (CPU). On CUDA a 63-bit seed is drawn from it
            and passed to the kernel.
    Returns:
        ptr int64 [B + 1] and nbr int64 [ptr[-1]]: the sampled neighbors of seeds[b] are
        nbr[ptr[b]:ptr[b+1]], min(deg, fanout) of them, from distinct edge positions. On the device
        of `indptr`.
    """
    if isinstance(indptr, torch.Tensor) and indptr.is_cuda:
        from ..kernels.sample_gpu import sample_neighbors_cuda

        (fanout,) = check_fanouts([fanout], "fanout")
        seed = kernel_seed(generator)
        seeds = torch.as_tensor(seeds).to(device=indptr.device, dtype=torch.int64)
        return sample_neighbors_cuda(indptr, indices, seeds, fanout, seed)
    indices_t = _as_long(indices, "indices")
    ptr, eid = sample_edge_positions(indptr, indices_t, seeds, fanout, generator)
    return ptr, indices_t[eid]


def place_adjacency(indptr, indices, device: torch.device | str = "cpu",
                    budget_bytes: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Put the (global) CSR where the sampler reads it.

    CPU: int64 torch tensors sharing the numpy memory. CUDA: `indptr` on the GPU (8 bytes per node);
    `indices` on the GPU when it fits `budget_bytes` (0: no limit), else in pinned host memory,
    which the sampling kernel reads zero-copy through unified addressing.

    Returns:
        (indptr, indices, tier) with tier "cpu", "device" or "pinned-host".
    """
    ip = torch.as_tensor(np.asarray(indptr, dtype=np.int64))
    ix = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    device = torch.device(device)
    if device.type != "cuda":
        return ip, ix, "cpu"
    ip = ip.to(device)
    if budget_bytes and ix.numel() * 8 > budget_bytes:
        return ip, ix.pin_memory(), "pinned-host"
    return ip, ix.to(device), "device"
