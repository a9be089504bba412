"""One CSR for a rank's local and remote entries: halo_csr's fused pass.

A plan with remote work (P > 1) has a local CSR (columns: own rows, [0, n)) and a remote CSR
(columns: halo slots, [0, H)). `fuse_rows` joins them row by row into one CSR over a table of
n + H rows, own rows first and halo slot h at row n + h:

    row t:  its local entries (columns c)  then  its remote entries (columns n + h)

so one pass of the csr_rows kernels reads each row's whole neighbourhood and writes it once,
with no second pass adding the remote sums to rows already written. `fused_factors` carries the
two parts' weight factors (mgg.kernels.csr_rows.weights, mgg.kernels.halo_csr.remote_factors) over
to the joined CSR and checks them against every joined weight.

All on the device of the given tensors (torch ops).
"""
from __future__ import annotations

import numpy as np
import torch

from .csr_rows import SourceCsr, WeightFactors
from .csr_rows.weights import max_rel_dev

__all__ = ["fuse_rows", "fused_factors", "fused_csr"]


def _rows_of(indptr: torch.Tensor, entries: int) -> torch.Tensor:
    """int64 [entries]: the row of every entry of a CSR with row pointers `indptr`."""
    n = int(indptr.shape[0]) - 1
    deg = indptr[1:] - indptr[:-1]
    return torch.repeat_interleave(torch.arange(n, device=indptr.device), deg, output_size=entries)


def fuse_rows(local: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
              remote: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
              n_local: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The joined CSR of a local (indptr int64 [n + 1], src int32 [El] in [0, n), weight float32
    [El]) and a remote (indptr int64 [n + 1], slot int32 [Er] in [0, H), weight float32 [Er]) CSR
    over the same n rows. Returns (indptr int64 [n + 1], src int32 [El + Er] in [0, n + H),
    weight float32 [El + Er]): each row's local entries in their order, then its remote entries
    in theirs, remote columns shifted by n."""
    ip_l, src_l, w_l = local
    ip_r, slot_r, w_r = remote
    el, er = int(src_l.shape[0]), int(slot_r.shape[0])
    dev = ip_l.device
    indptr = ip_l + ip_r  # row t starts after the entries of both parts of rows < t
    src = torch.empty(el + er, dtype=torch.int32, device=dev)
    weight = torch.empty(el + er, dtype=torch.float32, device=dev)
    if el:  # local entry j of row t lands at j + (remote entries of rows < t)
        pos = torch.arange(el, device=dev) + ip_r[_rows_of(ip_l, el)]
        src[pos] = src_l.to(torch.int32)
        weight[pos] = w_l
        del pos
    if er:  # remote entry k of row t lands at k + (local entries of rows <= t)
        pos = torch.arange(er, device=dev) + ip_l[1:][_rows_of(ip_r, er)]
        src[pos] = slot_r.to(torch.int32) + int(n_local)
        weight[pos] = w_r
    return indptr, src, weight


def _deviation(indptr: torch.Tensor, src: torch.Tensor, weight: torch.Tensor, rf: np.ndarray | None,
               cf: np.ndarray | None) -> float:
    """max |rf[row] * cf[col] - w| / |w| over every entry of the joined CSR (None factors are 1):
    csr_rows.weights.max_rel_dev, in blocks, on the tensors' device."""
    if src.device.type == "cpu":
        return max_rel_dev(indptr.numpy(), src.numpy(), weight.numpy(), rf, cf)
    return max_rel_dev(indptr.cpu().numpy(), None, None, rf, cf, device=src.device, on_device=(indptr, src, weight))


def fused_factors(local: WeightFactors, remote: WeightFactors, local_indptr: torch.Tensor,
                  indptr: torch.Tensor, src: torch.Tensor, weight: torch.Tensor, rtol: float = 2e-6) -> WeightFactors:
    """The weight mode of the joined CSR (`fuse_rows`'s indptr, src, weight), from the local
    CSR's factors `local` and the remote CSR's `remote` (the remote column factor is per halo
    slot), checked against every joined weight:

      one     both parts "one": w = rf[row], rf taken from the local part where the row has local
              entries, else from the remote part (or no rf at all: w = 1)
      column  both parts "column": w = rf[row] * cf[col], cf = [local cf | remote cf] (n + H)
      weighted otherwise, or where the check fails
    """
    if local.mode == remote.mode == "one":
        rf = None
        if local.row is not None or remote.row is not None:
            n = int(indptr.shape[0]) - 1
            has_local = (local_indptr[1:] - local_indptr[:-1]).cpu().numpy() > 0
            lr = local.row if local.row is not None else np.zeros(n, np.float32)
            rr = remote.row if remote.row is not None else np.zeros(n, np.float32)
            rf = np.where(has_local, lr, rr).astype(np.float32)
        if _deviation(indptr, src, weight, rf, None) == 0.0:
            return WeightFactors("one", row=rf, note="joined: w = rf[row]")
        return WeightFactors("weighted", note="joined weights are not rf[row]")
    if local.mode == remote.mode == "column" and local.col is not None and remote.col is not None:
        cf = np.concatenate([local.col, remote.col]).astype(np.float32)
        dev_max = _deviation(indptr, src, weight, local.row, cf)
        if dev_max <= rtol:
            return WeightFactors("column", row=local.row, col=cf, max_rel_dev=dev_max,
                                 note="joined: w = rf[row] * cf[col]")
        return WeightFactors("weighted", max_rel_dev=dev_max, note="joined weights do not factor")
    return WeightFactors("weighted", note=f"local weights {local.mode}, remote {remote.mode}")


def fused_csr(local: tuple[torch.Tensor, torch.Tensor, torch.Tensor], local_factors: WeightFactors,
              remote: tuple[torch.Tensor, torch.Tensor, torch.Tensor], remote_factors: WeightFactors,
              n_local: int, halo_size: int) -> SourceCsr:
    """The SourceCsr of the joined CSR (`fuse_rows`, `fused_factors`) over n_local + halo_size
    table rows."""
    indptr, src, weight = fuse_rows(local, remote, n_local)
    factors = fused_factors(local_factors, remote_factors, local[0], indptr, src, weight)
    return SourceCsr(indptr, src, weight, int(n_local) + int(halo_size), factors)
