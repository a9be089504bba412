"""Launchers of mgg/kernels/sample.cu: GPU neighbor sampling, Fused-Map and the zero-copy gather.

The kernels are plain CUDA C, built once into a cubin (mgg.kernels.build, cached on disk) and
loaded per GPU (mgg.kernels.launch). Tensors are passed as raw pointers, so an argument may live in device memory or in pinned
host memory registered for device access (`cudaHostRegister` / `pin_memory()`): that is how the
sampler reads a CSR and the host tier reads features that do not fit the GPU budget.
All launches go to torch's current CUDA stream of the tensors' GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .launch import blocks_for, kernel, launch

__all__ = ["sample_neighbors_cuda", "fused_map_cuda", "sample_hop_cuda", "sample_counts_cuda", "SampledHop",
           "BoundedHop", "sample_hop_bounded_cuda", "gather_host_rows_cuda", "THREADS"]

THREADS = 256   # == SAMPLE_THREADS of sample.cu (sample_uniform's shared memory is sized for it)
#: blocks per SM of the zero-copy gather: 8 warps, each lane 4 loads in flight (1-32 blocks/SM
#: measured the same 38-44 GB/s on H200; one leaves the most of every SM to compute)
HOST_GATHER_BLOCKS_PER_SM = 1


def _ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None or t.numel() == 0 else t.data_ptr())


_NULL = np.uint64(0)  # a null device pointer argument


def _launch(name: str, n_threads: int, args: tuple, device: torch.device, blocks_per_sm: int = 32) -> None:
    if n_threads <= 0:
        return
    launch(kernel("sample", name, device), device, blocks_for(n_threads, THREADS, device, blocks_per_sm), THREADS,
           args)


def sample_neighbors_cuda(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanout: int,
                          seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform sampling without replacement of min(deg, fanout) edge positions per seed.

    Args:
        indptr: int64 [N+1], indices: int64 [E] -- on the GPU or in pinned host memory.
        seeds: int64 [B] CUDA tensor of node ids. fanout: > 0, or -1 for all neighbors.
        seed: the random stream (same seed, same sample).
    Returns:
        (ptr int64 [B+1], nbr int64 [ptr[-1]]) on seeds' device.
    """
    dev = seeds.device
    seeds = seeds.to(torch.int64).contiguous()
    # degrees of the seeds (a pinned host CSR is indexed on the host; the kernel reads it in place)
    lo = indptr.index_select(0, seeds.to(indptr.device)).to(dev)
    hi = indptr.index_select(0, (seeds + 1).to(indptr.device)).to(dev)
    deg = hi - lo
    k = deg if fanout < 0 else torch.clamp(deg, max=int(fanout))
    ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(k, 0, out=ptr[1:])
    total = int(ptr[-1].item())
    nbr = torch.empty(total, dtype=torch.int64, device=dev)
    _launch("sample_uniform", seeds.numel(),
            (_ptr(indptr), _ptr(indices), _ptr(seeds), _ptr(ptr), np.int64(seeds.numel()),
             np.int32(fanout if fanout > 0 else 1 << 30), np.uint64(seed & (2 ** 64 - 1)), _ptr(nbr), _NULL), dev)
    return ptr, nbr


def _hash_table(n: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.int64]:
    """(keys, values, mask) of an empty Fused-Map table for at most n distinct keys: capacity a
    power of two >= 2 n (load factor <= 1/2), keys and values all ones (EMPTY_KEY; the largest
    unsigned position), set by one fill. A hop's keys are node ids, so n is at most the graph's
    node count however many elements the hop maps."""
    cap = 1 << max(4, int(2 * n - 1).bit_length())
    table = torch.full((2, cap), -1, dtype=torch.int64, device=dev)
    return table[0], table[1], np.int64(cap - 1)


def fused_map_cuda(ids: torch.Tensor, n_seeds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicate ids and map each to its local index with one GPU hash-table pass (Fused-Map).

    Args:
        ids: int64 [n] CUDA tensor of global ids (>= 0); ids[:n_seeds] are the seeds (unique).
    Returns:
        (n_id int64 [U]: unique ids in first-occurrence order, seeds first;
         local int64 [n]: n_id[local] == ids).
    """
    dev = ids.device
    ids = ids.to(torch.int64).contiguous()
    n = ids.numel()
    if n == 0:
        return ids.clone(), ids.clone()
    keys, vals, mask = _hash_table(n, dev)
    first_pos = torch.empty(n, dtype=torch.int64, device=dev)
    is_first = torch.empty(n, dtype=torch.uint8, device=dev)
    args = (_ptr(ids), np.int64(n), _NULL, _NULL, _ptr(keys), _ptr(vals), mask)
    _launch("fused_map_insert", n, args, dev)
    _launch("fused_map_lookup", n, args + (_ptr(first_pos), _ptr(is_first)), dev)
    flag = is_first.to(torch.int64)
    lid = torch.cumsum(flag, 0) - 1          # local id of each first occurrence, in order
    n_id = ids[is_first.bool()]
    local = lid.index_select(0, first_pos)
    return n_id, local


#: next_fanout of fused_map_compact for "every neighbor" (-1): larger than any degree
_ALL = np.int64(1 << 62)


def sample_counts_cuda(indptr: torch.Tensor, nodes: torch.Tensor, fanout: int) -> torch.Tensor:
    """int64 [n] on nodes' device: min(deg(nodes[i]), fanout) (fanout -1: the degree)."""
    dev = nodes.device
    lo = indptr.index_select(0, nodes.to(indptr.device)).to(dev)
    hi = indptr.index_select(0, (nodes + 1).to(indptr.device)).to(dev)
    deg = hi - lo
    return deg if fanout < 0 else deg.clamp_(max=int(fanout))


@dataclass
class SampledHop:
    """One hop of a sampled batch on the GPU (every tensor on the nodes' device).

    Attributes:
        ptr: int64 [n_dst + 1] CSR row pointer of the hop's sampled edges over its dst nodes.
        local: int64 [edges] local id (position in n_id) of every sampled neighbor.
        n_id: int64 [U] the hop's src nodes: its dst nodes first, then new neighbors in order of
            first occurrence.
        count: int64 [n_dst] sampled neighbors of every dst node (diff of ptr).
        edges: sampled edges (ptr[-1]).
        next_count: int64 [U] the next hop's sample counts of n_id (None after the last hop).
        next_edges: their sum, the next hop's edge count (0 after the last hop).
    """

    ptr: torch.Tensor
    local: torch.Tensor
    n_id: torch.Tensor
    count: torch.Tensor
    edges: int
    next_count: torch.Tensor | None
    next_edges: int


def sample_hop_cuda(indptr: torch.Tensor, indices: torch.Tensor, nodes: torch.Tensor, count: torch.Tensor,
                    fanout: int, seed: int, edges: int | None = None, next_fanout: int = 0) -> SampledHop:
    """One hop of sampling plus its Fused-Map with a single device-to-host copy.

    The sampled neighbors are written straight behind the dst nodes into the id buffer the map
    reads; the map kernels take the element count from the device (ptr[-1]), so nothing waits
    for it; one copy at the end brings (edges, U, next hop's edges) to the host. The output
    equals sample_neighbors_cuda followed by fused_map_cuda on [nodes, nbr] with the same seed.

    Args:
        indptr: int64 [N + 1], indices: int64 [E] -- on the GPU or in pinned host memory.
        nodes: int64 [n_dst] CUDA tensor, unique node ids (the dst nodes of the hop).
        count: int64 [n_dst] sample_counts_cuda(indptr, nodes, fanout).
        fanout: >= 1, or -1 for every neighbor. seed: the kernel's random stream.
        edges: count.sum() when the host knows it (from the previous hop's copy); None: the
            buffers are sized for n_dst * fanout (fanout >= 1 then).
        next_fanout: the next hop's fanout (>= 1 or -1), 0 when this is the last hop.
    """
    dev = nodes.device
    nodes = nodes.to(torch.int64).contiguous()
    n_dst = nodes.numel()
    ptr = torch.zeros(n_dst + 1, dtype=torch.int64, device=dev)
    if n_dst == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return SampledHop(ptr, empty, empty, count, 0, empty if next_fanout else None, 0)
    if edges is None and fanout < 1:
        raise ValueError("sample_hop_cuda: fanout -1 (every neighbor) needs the hop's edge count")
    bound = n_dst * int(fanout) if edges is None else int(edges)
    torch.cumsum(count, 0, out=ptr[1:])
    n_id, local, next_count, rank = _sample_and_map(indptr, indices, nodes, None, ptr, bound, fanout, seed,
                                                    next_fanout)
    sizes = [ptr[-1], rank[-1]] + ([next_count.sum()] if next_count is not None else [])
    got = torch.stack(sizes).tolist()   # the hop's one host synchronisation
    e, u = int(got[0]), int(got[1])
    nxt = None if next_count is None else next_count[:u]
    return SampledHop(ptr, local[:e], n_id[:u], count, e, nxt, int(got[2]) if nxt is not None else 0)


@dataclass
class BoundedHop:
    """One hop sampled into buffers sized by upper bounds, its sizes still on the device.

    Attributes:
        ptr: int64 [dst_bound + 1]: the CSR row pointer, flat past the real dst nodes.
        local: int64 [edge_bound]: local ids of the sampled neighbors (the first `edges`).
        n_id: int64 [u_bound]: the hop's src nodes (the first `unique`).
        next_count: int64 [u_bound] (zeros past `unique`) or None after the last hop.
        edges, unique: int64 [1] CUDA views: the sampled edge count and the number of src nodes.
        u_bound: n_id's length.
    """

    ptr: torch.Tensor
    local: torch.Tensor
    n_id: torch.Tensor
    next_count: torch.Tensor | None
    edges: torch.Tensor
    unique: torch.Tensor
    u_bound: int


def sample_hop_bounded_cuda(indptr: torch.Tensor, indices: torch.Tensor, nodes: torch.Tensor,
                            n_nodes: torch.Tensor | None, count: torch.Tensor, fanout: int, seed: int,
                            next_fanout: int = 0) -> BoundedHop:
    """`sample_hop_cuda` without its host synchronisation: the dst nodes' count may itself be on
    the device, every buffer is sized by an upper bound, and the kernels read the real counts
    on the device. The sample and the numbering are the same as `sample_hop_cuda`'s.

    Args:
        nodes: int64 [dst_bound] CUDA; the first n_nodes are the (unique) dst nodes, the rest anything.
        n_nodes: int64 [1] CUDA view of the dst count, or None (all dst_bound are dst nodes).
        count: int64 [dst_bound]: min(deg, fanout) of the dst nodes, 0 past them.
        fanout: >= 1 (the edge bound is dst_bound * fanout). seed, next_fanout: as sample_hop_cuda.
    """
    if fanout < 1:
        raise ValueError("sample_hop_bounded_cuda: the edge bound needs a fanout >= 1")
    dst_bound = int(nodes.numel())
    ptr = torch.zeros(dst_bound + 1, dtype=torch.int64, device=nodes.device)
    torch.cumsum(count, 0, out=ptr[1:])
    n_id, local, next_count, rank = _sample_and_map(indptr, indices, nodes, n_nodes, ptr, dst_bound * int(fanout),
                                                    fanout, seed, next_fanout)
    return BoundedHop(ptr, local, n_id, next_count, ptr[dst_bound:], rank[-1:], int(n_id.numel()))


def _sample_and_map(indptr: torch.Tensor, indices: torch.Tensor, nodes: torch.Tensor, n_nodes: torch.Tensor | None,
                    ptr: torch.Tensor, edge_bound: int, fanout: int, seed: int, next_fanout: int):
    """A hop's kernels once its row pointer is known: the sample written behind the real dst nodes
    in the id buffer, the Fused-Map of [dst nodes, neighbors], the compaction.

    Args:
        nodes: int64 [dst_bound] CUDA; the first n_nodes are the dst nodes (all when n_nodes is None,
            else an int64 [1] CUDA view read on the device).
        ptr: int64 [dst_bound + 1]: the prefix sums of the sample counts (flat past the dst nodes).
        edge_bound: at least the sampled edges (ptr[-1]). fanout, seed, next_fanout: as sample_hop_cuda.
    Returns:
        (n_id int64 [u_bound], local int64 [edge_bound], next_count int64 [u_bound] or None,
         rank int64 [dst_bound + edge_bound]: the prefix sums of the first occurrences).
    """
    dev = nodes.device
    dst_bound = int(nodes.numel())
    n = dst_bound + int(edge_bound)
    edges = ptr[dst_bound:]   # the hop's edge count, on the device
    ids = torch.empty(n, dtype=torch.int64, device=dev)
    ids[:dst_bound].copy_(nodes)   # the neighbors overwrite the tail past the real dst nodes
    # neighbors behind the real dst nodes: at n_nodes (on the device), or at dst_bound
    out, base = (ids, _ptr(n_nodes)) if n_nodes is not None else (ids[dst_bound:], _NULL)
    _launch("sample_uniform", dst_bound,
            (_ptr(indptr), _ptr(indices), _ptr(nodes), _ptr(ptr), np.int64(dst_bound),
             np.int32(fanout if fanout > 0 else 1 << 30), np.uint64(seed & (2 ** 64 - 1)), _ptr(out), base), dev)
    keys, vals, mask = _hash_table(min(n, indptr.numel() - 1), dev)
    first_pos = torch.empty(n, dtype=torch.int64, device=dev)
    is_first = torch.zeros(n, dtype=torch.uint8, device=dev)   # 0 past the real elements
    fixed = _ptr(n_nodes) if n_nodes is not None else _NULL
    args = (_ptr(ids), np.int64(dst_bound), fixed, _ptr(edges), _ptr(keys), _ptr(vals), mask)
    _launch("fused_map_insert", n, args, dev)
    _launch("fused_map_lookup", n, args + (_ptr(first_pos), _ptr(is_first)), dev)
    rank = torch.cumsum(is_first, 0, dtype=torch.int64)
    u_bound = min(n, indptr.numel() - 1)
    n_id = torch.empty(u_bound, dtype=torch.int64, device=dev)
    local = torch.empty(int(edge_bound), dtype=torch.int64, device=dev)
    next_count = torch.zeros(u_bound, dtype=torch.int64, device=dev) if next_fanout else None
    _launch("fused_map_compact", n,
            (_ptr(ids), np.int64(dst_bound), fixed, _ptr(edges), _ptr(first_pos), _ptr(is_first), _ptr(rank),
             _ptr(indptr), _ALL if next_fanout < 0 else np.int64(next_fanout), _ptr(n_id), _ptr(local),
             _ptr(next_count)), dev)
    return n_id, local, next_count, rank


def gather_host_rows_cuda(table: torch.Tensor, rows: torch.Tensor,
                          blocks_per_sm: int = HOST_GATHER_BLOCKS_PER_SM) -> torch.Tensor:
    """out[r] = table[rows[r]] read zero-copy with 128-byte-aligned warp accesses.

    Args:
        table: float32 [N, F] in pinned / cudaHostRegister-ed host memory (or on the GPU); rows
            contiguous in memory with stride table.stride(0).
        rows: int64 [R] CUDA tensor.
        blocks_per_sm: grid cap (256-thread blocks per SM); the default leaves most of each SM
            to kernels running beside the gather (bench/sampled.py measures the bandwidth).
    Returns:
        float32 [R, F] CUDA tensor.
    """
    if table.dtype != torch.float32 or table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(f"gather_host_rows_cuda: need a row-major float32 [N, F] table, got "
                         f"{table.dtype} {tuple(table.shape)} strides {table.stride()}")
    dev = rows.device
    rows = rows.to(torch.int64).contiguous()
    out = torch.empty((rows.numel(), table.shape[1]), dtype=torch.float32, device=dev)
    if rows.numel() and table.shape[1]:
        _launch("gather_rows_aligned", rows.numel() * 32,
                (_ptr(table), np.int64(table.stride(0)), np.int32(table.shape[1]), _ptr(rows),
                 np.int64(rows.numel()), _ptr(out)), dev, blocks_per_sm)
    return out
