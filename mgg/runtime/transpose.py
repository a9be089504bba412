"""One rank's rows of the transposed CSR (W^T), built with counting sorts (CPU) or radix sorts (GPU).

`transposed_rows(indptr, indices, lo, hi)` returns, for every source node j in [lo, hi), the
targets i of the edges j -> i, in increasing CSR position (so targets ascend, and duplicate edges
keep their CSR order): the stable sort by source of the selected CSR entries.

* CPU (device None or "cpu"): scipy's `csr_tocsc`, an O(E + N) counting sort in C.
* CUDA (device "cuda[:k]"): `torch.sort(stable=True)` (a CUB radix sort) on the device.

Both give the same arrays bit for bit (tests/test_transpose.py checks them against the former
argsort/searchsorted construction).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["transposed_rows", "plan_device"]


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
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    dev = plan_device(device)
    if method == "auto":
        method = "counting" if dev.type == "cpu" else "torch"
    if method not in ("counting", "torch"):
        raise ValueError(f"transposed_rows: method must be 'auto', 'counting' or 'torch', got {method!r}")
    if method == "counting":
        return _counting(indptr, indices, lo, hi)
    return _torch_sort(indptr, indices, lo, hi, dev)


def _counting(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int):
    num_nodes, n = len(indptr) - 1, hi - lo
    if lo == 0 and hi == num_nodes:
        cols, sel_indptr = indices, indptr
    else:
        mask = (indices >= lo) & (indices < hi)
        cm = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(mask, out=cm[1:])
        sel_indptr = cm[indptr]  # selected entries per CSR row, as a CSR row pointer
        cols = indices[mask] - lo
    k = len(cols)
    if k == 0 or n == 0:
        ip = np.zeros(n + 1, dtype=np.int64)
        e = np.zeros(0, dtype=np.int64)
        return ip, e, e.copy()
    csr = sp.csr_matrix((np.zeros(k, dtype=np.int8), cols, sel_indptr), shape=(num_nodes, n), copy=False)
    csc = csr.tocsc()  # csr_tocsc: counting sort by column, row-major (stable) inside a column
    ip = csc.indptr.astype(np.int64, copy=False)
    tgt = csc.indices.astype(np.int64, copy=False)
    src = lo + np.repeat(np.arange(n, dtype=np.int64), np.diff(ip))
    return ip, tgt, src


def _torch_sort(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int, dev: torch.device):
    n = hi - lo
    ip_t = torch.from_numpy(indptr).to(dev)
    idx = torch.from_numpy(indices).to(dev)
    sel = torch.nonzero((idx >= lo) & (idx < hi)).reshape(-1)
    src = idx[sel]
    tgt = torch.searchsorted(ip_t, sel, right=True) - 1  # the row holding CSR entry k
    src, order = torch.sort(src, stable=True)
    tgt = tgt[order]
    ip = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    if n:
        torch.cumsum(torch.bincount(src - lo, minlength=n), 0, out=ip[1:])
    return ip.cpu().numpy(), tgt.cpu().numpy(), src.cpu().numpy()
