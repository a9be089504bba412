"""How the csr_rows kernels get their edge weights: the cheapest exact weight mode of a plan.

  one      w = 1 * rf[row]          `sum` (rf = none); `mean` forward (rf = 1 / deg_in(row))
  column   w = cf[col] * rf[row]    `gcn` (cf = rf = dinv); `mean` transposed (cf = 1 / deg_in(col))
  weighted w = plan.local_weight    everything else (and any plan whose weights do not match)

`factor_weights` derives the factors from the plan itself and checks them against every plan
weight once (on the GPU when given one), so a mode is only used where it reproduces the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...runtime.plan import AggregationPlan
from ...runtime.weights import UNIT_WEIGHT_KINDS, dinv_from_self_weight

#: kernel weight modes (template W of mgg_csr_rows): per-edge array, 1 * row factor, column factor
WEIGHT_MODES = {"weighted": 0, "one": 1, "column": 2}


@dataclass
class WeightFactors:
    """How the kernel gets edge weights: mode (see WEIGHT_MODES), optional float32 [n] row factor
    rf and column factor cf, and the largest relative deviation from the plan's weights."""

    mode: str
    row: np.ndarray | None = None
    col: np.ndarray | None = None
    max_rel_dev: float = 0.0
    note: str = field(default="")


def _row_blocks(indptr: np.ndarray, block: int = 1 << 23):
    """Yield (r0, r1) row ranges of the CSR holding about `block` entries each."""
    n = len(indptr) - 1
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + block, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        yield r0, r1
        r0 = r1


def max_rel_dev(indptr, indices, w, rf, cf, device=None, on_device=None) -> float:
    """max |rf[row] * cf[col] - w| / |w| over all entries (float32 [n] factors, None = 1),
    computed in float32 blocks (a plan-time check); on `device` (a CUDA device) with torch,
    reading `on_device` = (indptr, indices, weights) tensors already there when given."""
    if device is not None and torch.device(device).type == "cuda":
        return _max_rel_dev_torch(indptr, indices, w, rf, cf, torch.device(device), on_device=on_device)
    worst = 0.0
    for r0, r1 in _row_blocks(indptr):
        a, b = int(indptr[r0]), int(indptr[r1])
        if a == b:
            continue
        f = (np.repeat(rf[r0:r1], np.diff(indptr[r0: r1 + 1])) if rf is not None
             else np.ones(b - a, np.float32))
        if cf is not None:
            f = f * cf[indices[a:b]]
        ws = w[a:b]
        np.subtract(f, ws, out=f)
        np.abs(f, out=f)
        f /= np.maximum(np.abs(ws), np.float32(1e-30))
        worst = max(worst, float(f.max()))
    return worst


def _max_rel_dev_torch(indptr, indices, w, rf, cf, dev: torch.device, block: int = 1 << 26,
                       on_device=None) -> float:
    """max_rel_dev with torch on `dev`, in blocks of `block` entries (the same float32 math);
    `on_device`: (indptr int64, indices int32/int64, weights float32) tensors on `dev`, read
    instead of uploading the host arrays block by block."""
    n = len(indptr) - 1
    ip_d, idx_d, w_d = on_device if on_device is not None else (None, None, None)
    ip = ip_d if ip_d is not None else torch.from_numpy(np.ascontiguousarray(indptr, np.int64)).to(dev)
    rf_t = None if rf is None else torch.from_numpy(np.ascontiguousarray(rf, np.float32)).to(dev)
    cf_t = None if cf is None else torch.from_numpy(np.ascontiguousarray(cf, np.float32)).to(dev)
    e = int(indptr[-1])
    worst = torch.zeros((), dtype=torch.float32, device=dev)
    for a in range(0, e, block):
        b = min(e, a + block)
        ws = w_d[a:b] if w_d is not None else torch.from_numpy(np.ascontiguousarray(w[a:b], np.float32)).to(dev)
        f = torch.ones(b - a, dtype=torch.float32, device=dev)
        if rf_t is not None:
            pos = torch.arange(a, b, device=dev)
            row = torch.searchsorted(ip, pos, right=True) - 1
            f = rf_t[row.clamp_(0, n - 1)]
        if cf_t is not None:
            cols = (idx_d[a:b].long() if idx_d is not None
                    else torch.from_numpy(np.ascontiguousarray(indices[a:b], np.int64)).to(dev))
            f = f * cf_t[cols]
        worst = torch.maximum(worst, ((f - ws).abs_() / ws.abs().clamp_min(1e-30)).max())
    return float(worst)


def factor_weights(plan: AggregationPlan, kind: str | None, rtol: float = 2e-6,
                   device=None, on_device=None) -> WeightFactors:
    """The cheapest exact weight mode of `plan`'s local CSR for aggregation `kind`.

    sum: every weight 1 -> "one". mean: weights constant per row (forward, 1/deg_in(target)) ->
    "one" with a row factor; constant per column (transposed, 1/deg_in(column)) -> "column".
    gcn: w = dinv[row] * dinv[col] with dinv recovered from the self weights 1/(deg_in + 1) ->
    "column" with cf = rf = dinv (checked to `rtol`, float32 rounding of the product). Anything
    else, or a plan whose weights do not match: "weighted". The checks run on `device` (CUDA:
    torch, reading `on_device` = (indptr, indices, weights) of the local CSR already uploaded
    there when given; None: numpy on the host).
    """
    ip = np.asarray(plan.local_indptr, np.int64)
    idx = np.asarray(plan.local_indices, np.int64)
    w = np.asarray(plan.local_weight, np.float32)
    n = plan.n_local
    if kind is None:
        return WeightFactors("weighted", note="no kind given")
    if len(w) == 0:
        return WeightFactors("one", note="no edges")
    if kind in UNIT_WEIGHT_KINDS:  # sum_self's diagonal (1) is the plan's self weight
        if bool(np.all(w == 1.0)):
            return WeightFactors("one", note=f"{kind}: w = 1")
    elif kind == "mean":
        deg = np.diff(ip)
        rf = np.zeros(n, np.float32)
        rf[deg > 0] = w[ip[:-1][deg > 0]]
        if max_rel_dev(ip, idx, w, rf, None, device, on_device) == 0.0:
            return WeightFactors("one", row=rf, note="mean forward: w = rf[row]")
        cf = np.zeros(n, np.float32)
        cf[idx] = w
        if max_rel_dev(ip, idx, w, None, cf, device, on_device) == 0.0:
            return WeightFactors("column", col=cf, note="mean transposed: w = cf[col]")
    elif kind == "gcn" and plan.has_self:
        sw = np.asarray(plan.self_weight, np.float64)
        if np.all(sw > 0):
            dinv = dinv_from_self_weight(sw)
            dev = max_rel_dev(ip, idx, w, dinv, dinv, device, on_device)
            if dev <= rtol:
                return WeightFactors("column", row=dinv, col=dinv, max_rel_dev=dev,
                                     note="gcn: w = dinv[row] * dinv[col]")
    return WeightFactors("weighted", note=f"{kind}: weights do not factor, per-edge weights read")

