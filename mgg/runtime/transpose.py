"""One rank's rows of the transposed CSR (W^T), built with counting sorts (CPU) or radix sorts (GPU).

`transposed_rows(indptr, indices, lo, hi)` returns, for every source node j in [lo, hi), the
targets i of the edges j -> i, in increasing CSR position (so targets ascend, and duplicate edges
keep their CSR order): the stable sort by source of the selected CSR entries.

* CPU (device None or "cpu"): scipy's `csr_tocsc`, an O(E + N) counting sort in C.
* CUDA (device "cuda[:k]"): `torch.sort(stable=True)` (a CUB radix sort) on the device.

`transposed_rows_exchange` builds the same rows without the global `indices`: each rank sends
the edges of its forward rows to the owners of their sources (one all-to-all) and sorts what it
receives (a memory-mapped graph is then read only at the rank's own rows).

Both give the same arrays bit for bit (tests/runtime/test_plan_build.py checks them against the former
argsort/searchsorted construction).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["transposed_rows", "transposed_rows_t", "transposed_rows_exchange", "plan_device", "sort_within_rows"]


def plan_device(device: str | torch.device | None) -> torch.device:
    """torch.device for plan building: None -> cpu."""
    return torch.device("cpu") if device is None else torch.device(device)


def transposed_rows(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int,
                    device: str | torch.device | None = None, method: str = "auto"
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows [lo, hi) of W^T: every edge j -> i of the CSR (row i holds j) with j in [lo, hi).

    Args:
        indptr: int64 [N + 1], indices: int64 [E] (rows = targets, entries = sources).
        lo, hi: this rank's node range.
        device: where to sort (None/"cpu": host counting sort; "cuda": torch radix sort).
        method: "auto" (by device), "counting" (scipy, host) or "torch" (torch.sort on device).

    Returns:
        (indptr int64 [hi - lo + 1], targets int64 [k], sources int64 [k]) as numpy arrays,
        sorted by source, then CSR position.
    """
    ip, tgt = transposed_rows_t(indptr, indices, lo, hi, device, method)
    ip, tgt = ip.cpu().numpy(), tgt.cpu().numpy()
    src = lo + np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(ip))
    return ip, tgt, src


def sort_within_rows(indptr: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """`indices` with the entries of every CSR row in ascending order (a new tensor), or
    `indices` itself when every row already ascends. indptr int64 [n + 1] (indptr[0] == 0),
    indices int64 [E], on one device (the sort runs there: a radix sort on a GPU).

    Why: the row kernels gather the rows their warps name at the same time, so with each
    neighbour list ascending the warps in flight read nearby source rows (one H200, csr_rows,
    generated graphs whose lists are in generation order: reddit-like 13-15% faster at D = 16
    and 64, products-like D = 16 gcn 5%: bench/results/2026-11-26-h200x1-5db1f89/c3).
    The transposed rows are already sorted (`transposed_rows`). A row's sum then adds its terms
    in another order: the same result up to float rounding."""
    e = indices.numel()
    out = indices
    if e < 2:
        return out
    for r0, r1 in _row_chunks(indptr, SORT_CHUNK):
        a, b = int(indptr[r0]), int(indptr[r1])
        if b - a < 2:
            continue
        part = indices[a:b]
        counts = indptr[r0 + 1: r1 + 1] - indptr[r0: r1]
        rows = torch.repeat_interleave(torch.arange(r1 - r0, device=indices.device), counts, output_size=b - a)
        if bool(((part[1:] >= part[:-1]) | (rows[1:] != rows[:-1])).all()):
            continue
        if out is indices:
            out = indices.clone()
        span = int(part.max()) + 1
        rows.mul_(span).add_(part)  # the key row * span + index, in place
        out[a:b] = torch.sort(rows).values % span
    return out


#: entries sorted at a time by sort_within_rows (bounds its scratch: about 4 int64 per entry)
SORT_CHUNK = 1 << 26


def _row_chunks(indptr: torch.Tensor, entries: int) -> list[tuple[int, int]]:
    """Consecutive row ranges [r0, r1) covering every row, each of at most `entries` entries
    unless one row alone has more."""
    n = indptr.numel() - 1
    ends = indptr[1:].cpu()
    out, r0 = [], 0
    while r0 < n:
        limit = int(indptr[r0]) + entries
        r1 = int(torch.searchsorted(ends, limit, right=True))
        r1 = max(r1, r0 + 1)
        out.append((r0, min(r1, n)))
        r0 = min(r1, n)
    return out


def transposed_rows_t(indptr, indices, lo: int, hi: int, device: str | torch.device | None = None,
                      method: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """`transposed_rows` as tensors on `device`, without the (implicit) source ids: (indptr int64
    [hi - lo + 1], targets int64 [k]); row j - lo holds the targets of source j. `indptr` and
    `indices` may be numpy arrays or tensors (the counting sort reads them on the host)."""
    dev = plan_device(device)
    if method == "auto":
        method = "counting" if dev.type == "cpu" else "torch"
    if method not in ("counting", "torch"):
        raise ValueError(f"transposed_rows: method must be 'auto', 'counting' or 'torch', got {method!r}")
    if method == "counting":
        ip, tgt = _counting(_host64(indptr), _host64(indices), lo, hi)
        return torch.from_numpy(ip).to(dev), torch.from_numpy(tgt).to(dev)
    return _torch_sort(_dev64(indptr, dev), _dev64(indices, dev), lo, hi)


def _host64(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.to(torch.int64).cpu().numpy()
    return np.asarray(a, dtype=np.int64)


def _dev64(a, dev: torch.device) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.to(device=dev, dtype=torch.int64)
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev)


def _counting(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int):
    num_nodes, n = len(indptr) - 1, hi - lo
    if lo == 0 and hi == num_nodes:
        cols, sel_indptr = indices, indptr
    else:
        mask = (indices >= lo) & (indices < hi)
        cm = torch.zeros(len(indices) + 1, dtype=torch.int64)
        torch.cumsum(torch.from_numpy(mask), 0, out=cm[1:])  # 10x numpy's bool -> int64 cumsum
        sel_indptr = cm.numpy()[indptr]  # selected entries per CSR row, as a CSR row pointer
        cols = indices[mask] - lo
    k = len(cols)
    if k == 0 or n == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    import scipy.sparse as sp  # imported on first use: slow to import

    csr = sp.csr_matrix((np.zeros(k, dtype=np.int8), cols, sel_indptr), shape=(num_nodes, n), copy=False)
    csc = csr.tocsc()  # csr_tocsc: counting sort by column, row-major (stable) inside a column
    return csc.indptr.astype(np.int64, copy=False), csc.indices.astype(np.int64, copy=False)


def _torch_sort(ip_t: torch.Tensor, idx: torch.Tensor, lo: int, hi: int):
    dev = idx.device
    n = hi - lo
    if lo == 0 and hi == ip_t.numel() - 1:  # the whole graph: every entry is selected
        sel = torch.arange(idx.numel(), device=dev)
        src = idx
    else:
        sel = torch.nonzero((idx >= lo) & (idx < hi)).reshape(-1)
        src = idx[sel]
    tgt = torch.searchsorted(ip_t, sel, right=True) - 1  # the row holding CSR entry k
    # stable radix sort by source; 32-bit keys (half the passes) when the range fits
    key = (src - lo).to(torch.int32) if n < 2 ** 31 else src
    key, order = torch.sort(key, stable=True)
    src = key.to(torch.int64) + lo
    tgt = tgt[order]
    ip = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    if n:
        torch.cumsum(torch.bincount(src - lo, minlength=n), 0, out=ip[1:])
    return ip, tgt


def transposed_rows_exchange(fwd_indptr: np.ndarray, fwd_indices: np.ndarray, bounds: np.ndarray,
                             rank: int, comm) -> tuple[np.ndarray, np.ndarray]:
    """`transposed_rows` of this rank from the forward rows of every rank, through one all-to-all.

    Args:
        fwd_indptr: int64 [n_r + 1] this rank's forward row pointer (row k = target bounds[rank] + k).
        fwd_indices: int64 [E_r] the sources of those rows (global ids).
        bounds: int64 [P + 1] node ranges of the ranks.
        comm: the communicator (`alltoallv`); collective.

    Each edge (source j, target i) goes to the owner of j. Rank q's block arrives in its CSR order
    (targets ascending, then CSR position), and blocks arrive in rank order, so the received
    edges are in global CSR order; a stable counting sort by source (scipy's csr_tocsc) then
    gives, per source, the targets in CSR order -- `transposed_rows` exactly.

    Returns:
        (indptr int64 [hi - lo + 1], targets int64 [k]) as numpy arrays, lo, hi = bounds[rank],
        bounds[rank + 1].
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    if int(bounds[-1]) >= _PACKED_LIMIT:
        return _exchange_pairs(fwd_indptr, fwd_indices, bounds, rank, comm)
    return _exchange_packed(fwd_indptr, fwd_indices, bounds, rank, comm)


#: node ids below this fit the packed exchange: (source << 32) | target in one int64
_PACKED_LIMIT = 1 << 31


def _exchange_packed(fwd_indptr, fwd_indices, bounds: np.ndarray, rank: int, comm) -> tuple[np.ndarray, np.ndarray]:
    """The exchange for N < 2^31: every edge travels as one int64 ``(source << 32) | target``.
    Sorting those values orders them by source, then target; within one source, targets in
    ascending order are the CSR order (CSR is target-major; equal pairs are duplicate edges), so
    one in-place sort on each side replaces the argsorts: about 24 B per edge of the rank at the
    peak (the sent values, the received values, the returned targets) instead of ~64."""
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    ip = np.asarray(fwd_indptr, dtype=np.int64)
    packed = np.asarray(fwd_indices, dtype=np.int64) << 32  # a new array: the caller's rows stay intact
    deg = np.diff(ip)
    packed |= np.repeat(np.arange(lo, lo + len(deg), dtype=np.int64), deg)
    del deg
    packed.sort()  # by source (hence by owner), then target
    cuts = np.searchsorted(packed, bounds << 32, side="left")
    counts = np.diff(cuts).astype(np.int64)
    recv, _ = comm.alltoallv(packed, counts)
    del packed
    recv.sort()  # each block arrived sorted; one sort merges them
    n = hi - lo
    if len(recv) == 0 or n == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    out_ip = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount((recv >> 32) - lo, minlength=n), out=out_ip[1:])
    recv &= 0xFFFFFFFF  # in place: the targets
    return out_ip, recv


def _exchange_pairs(fwd_indptr, fwd_indices, bounds: np.ndarray, rank: int, comm) -> tuple[np.ndarray, np.ndarray]:
    """The exchange for any N: sources and targets as separate int64 blocks, a stable counting
    sort by source on the receiver."""
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    src = np.asarray(fwd_indices, dtype=np.int64)
    ip = np.asarray(fwd_indptr, dtype=np.int64)
    tgt = lo + np.repeat(np.arange(len(ip) - 1, dtype=np.int64), np.diff(ip))
    owner = np.searchsorted(bounds, src, side="right") - 1
    order = np.argsort(owner, kind="stable")  # keeps CSR order inside every destination block
    counts = np.bincount(owner, minlength=len(bounds) - 1).astype(np.int64)
    # one message: per destination block, its sources then its targets
    pairs = np.empty(2 * len(src), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    s_sorted, t_sorted = src[order], tgt[order]
    del order, owner, tgt
    for q in range(len(counts)):
        a, b = starts[q], starts[q + 1]
        pairs[2 * a: 2 * a + (b - a)] = s_sorted[a:b]
        pairs[2 * a + (b - a): 2 * b] = t_sorted[a:b]
    del s_sorted, t_sorted
    recv, rcounts = comm.alltoallv(pairs, 2 * counts)
    del pairs
    rstarts = np.concatenate([[0], np.cumsum(rcounts)])
    r_src = np.concatenate([recv[rstarts[q]: rstarts[q] + rcounts[q] // 2] for q in range(len(rcounts))])
    r_tgt = np.concatenate([recv[rstarts[q] + rcounts[q] // 2: rstarts[q + 1]] for q in range(len(rcounts))])
    del recv
    n = hi - lo
    k = len(r_src)
    if k == 0 or n == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # stable counting sort by source: a [k, n] CSR with one entry per row, transposed by scipy
    import scipy.sparse as sp  # imported on first use: slow to import

    csr = sp.csr_matrix((np.zeros(k, dtype=np.int8), r_src - lo, np.arange(k + 1, dtype=np.int64)),
                        shape=(k, n), copy=False)
    csc = csr.tocsc()
    return csc.indptr.astype(np.int64, copy=False), r_tgt[csc.indices]
