"""Edge weights of the aggregation kinds, for one rank's rows of the global CSR.

Kinds (docs/architecture.md): `sum` w = 1; `mean` w = 1/deg_in(target); `gcn`
w = dinv[target] * dinv[source], diag = dinv^2, dinv = (deg_in + 1)^-1/2 over the global graph;
`sum_self` w = 1, diag = 1 (A + I: GIN-0's sum with the node's own row, one pass instead of a
sum and an elementwise add).

Every function takes numpy arrays (and returns numpy) or torch tensors (and returns tensors on
the device of `target` / `nodes`). Both compute in float64 with IEEE-exact operations (division,
square root, product) and round once to float32, so a plan built on the GPU carries bit for bit
the weights of one built on the host.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["KINDS", "UNIT_WEIGHT_KINDS", "check_kind", "pair_weights", "diag_weights", "pair_weights_by_row",
           "dinv_from_self_weight"]

KINDS = ("sum", "mean", "gcn", "sum_self")
UNIT_WEIGHT_KINDS = ("sum", "sum_self")  # kinds whose edge weights are all 1


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown aggregation kind {kind!r}; expected one of {', '.join(KINDS)}")


def _on(a, dev: torch.device) -> torch.Tensor:
    return a.to(dev) if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a)).to(dev)


def _dinv(deg: torch.Tensor) -> torch.Tensor:
    """float64 (deg + 1)^-1/2 as 1 / sqrt(deg + 1) (both ops correctly rounded on CPU and CUDA)."""
    return 1.0 / torch.sqrt(deg.to(torch.float64) + 1.0)


def pair_weights(kind: str, deg_in, target, source):
    """float32 [k] weights of edges source[k] -> target[k] (global ids); deg_in: int64 [N].

    numpy inputs give a numpy array; a tensor `target` gives a tensor on its device.
    """
    check_kind(kind)
    if not isinstance(target, torch.Tensor) and not isinstance(source, torch.Tensor):
        if kind in UNIT_WEIGHT_KINDS:
            return np.ones(len(target), dtype=np.float32)
        if kind == "mean":
            return (1.0 / np.maximum(deg_in[target], 1)).astype(np.float32)
        dinv = 1.0 / np.sqrt(deg_in.astype(np.float64) + 1.0)
        return (dinv[target] * dinv[source]).astype(np.float32)
    dev = target.device if isinstance(target, torch.Tensor) else source.device
    t = _on(target, dev)
    if kind in UNIT_WEIGHT_KINDS:
        return torch.ones(t.numel(), dtype=torch.float32, device=dev)
    deg = _on(deg_in, dev)
    if kind == "mean":
        return (1.0 / deg[t].clamp_min(1).to(torch.float64)).to(torch.float32)
    dinv = _dinv(deg)
    return (dinv[t] * dinv[_on(source, dev)]).to(torch.float32)


def pair_weights_by_row(kind: str, deg_in: torch.Tensor, indptr: torch.Tensor, row_lo: int,
                        other: torch.Tensor, row_is_target: bool) -> torch.Tensor:
    """float32 [E_r] weights of CSR rows [row_lo, row_lo + n) whose entries are `other` (global
    ids): row_is_target (forward W) gives w(other -> row), else (W^T) w(row -> other).

    Equal bit for bit to `pair_weights` on the expanded row ids, without materialising them for
    `gcn` (the row factor is repeated per row); tensors on one device.
    """
    check_kind(kind)
    dev = other.device
    e = other.numel()
    if kind in UNIT_WEIGHT_KINDS:
        return torch.ones(e, dtype=torch.float32, device=dev)
    if dev.type == "cpu":  # numpy's repeat / take are 3-10x faster than torch's on the host
        return torch.from_numpy(_by_row_numpy(kind, deg_in.numpy(), indptr.numpy(), row_lo,
                                              other.numpy(), row_is_target))
    counts = indptr[1:] - indptr[:-1]
    n = counts.numel()
    if kind == "mean":
        if row_is_target:
            per_row = (1.0 / deg_in[row_lo: row_lo + n].clamp_min(1).to(torch.float64)).to(torch.float32)
            return torch.repeat_interleave(per_row, counts, output_size=e)
        return (1.0 / deg_in[other].clamp_min(1).to(torch.float64)).to(torch.float32)
    dinv = _dinv(deg_in)
    row_f = torch.repeat_interleave(dinv[row_lo: row_lo + n], counts, output_size=e)
    return (row_f * dinv[other]).to(torch.float32)


def _by_row_numpy(kind: str, deg: np.ndarray, indptr: np.ndarray, row_lo: int, other: np.ndarray,
                  row_is_target: bool) -> np.ndarray:
    """pair_weights_by_row on host arrays (same float64 operations, same float32 result), in row
    blocks over torch's intra-op thread count (numpy releases the GIL in take/repeat/multiply)."""
    counts = np.diff(indptr)
    n, e = len(counts), len(other)
    out = np.empty(e, dtype=np.float32)
    if kind == "mean":
        table = (1.0 / np.maximum(deg, 1)).astype(np.float32)  # == per-entry 1/max(deg, 1) rounded
    else:
        table = 1.0 / np.sqrt(deg.astype(np.float64) + 1.0)

    def block(r0: int, r1: int) -> None:
        a, b = int(indptr[r0]), int(indptr[r1])
        if kind == "mean":
            out[a:b] = (np.repeat(table[row_lo + r0: row_lo + r1], counts[r0:r1]) if row_is_target
                        else np.take(table, other[a:b]))
            return
        w = np.repeat(table[row_lo + r0: row_lo + r1], counts[r0:r1])
        np.multiply(w, np.take(table, other[a:b]), out=w)
        out[a:b] = w

    threads = max(1, torch.get_num_threads())
    per = max(1 << 20, -(-e // (4 * threads)))  # entries per block
    cuts = np.unique(np.searchsorted(indptr, np.arange(0, e, per), side="right") - 1)
    spans = list(zip(cuts.tolist(), cuts[1:].tolist() + [n])) if n else []
    if threads == 1 or len(spans) <= 1:
        for r0, r1 in spans:
            block(r0, r1)
        return out
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(spans))) as pool:
        list(pool.map(lambda s: block(*s), spans))
    return out


def diag_weights(kind: str, deg_in, nodes):
    """float32 [k] self-term weights of `nodes`, or None for kinds without a self term
    (numpy in, numpy out; a tensor `nodes` gives a tensor on its device)."""
    check_kind(kind)
    if kind == "sum_self":
        if isinstance(nodes, torch.Tensor):
            return torch.ones(nodes.numel(), dtype=torch.float32, device=nodes.device)
        return np.ones(len(nodes), dtype=np.float32)
    if kind != "gcn":
        return None
    if isinstance(nodes, torch.Tensor):
        return (1.0 / (_on(deg_in, nodes.device)[nodes].to(torch.float64) + 1.0)).to(torch.float32)
    return (1.0 / (deg_in[nodes].astype(np.float64) + 1.0)).astype(np.float32)


def dinv_from_self_weight(self_weight) -> np.ndarray:
    """float32 [k] gcn factors dinv = (deg_in + 1)^-1/2 of k rows from their gcn self weights
    (float32 1 / (deg_in + 1), as diag_weights gives them): the degree is recovered exactly
    (rint(1 / w)), then dinv in float64, rounded once. The row and column factor of the gcn
    kind, for kernels that apply them per row (mgg.kernels.csr_rows) and for callers that fold
    the column factor into the op producing a table (DistGraph.aggregate(factors=SCALED_INPUT))."""
    deg1 = np.rint(1.0 / np.asarray(self_weight, np.float64))
    return (deg1 ** -0.5).astype(np.float32)
