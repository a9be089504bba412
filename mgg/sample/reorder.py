"""Match-Reorder (FastGL) and resident-feature reuse.

Consecutive mini-batches share nodes: the features of nodes in both batch i and batch i+1 are
already on the device after batch i. `ResidentCache` keeps the previous batch's (n_id, x) and
fetches only the rows that are not resident; `match_reorder` orders the batches of an epoch so
that consecutive batches overlap most, which is what makes the reuse pay.

Which node sets are compared: the *sampled* node sets of the batches (n_id of every batch of the
epoch, sampled up front by `NeighborLoader(reorder=True)` and then consumed in the new order), not
a proxy: the match degree of two batches is exactly the number of feature rows the second can
reuse from the first.

Ordering (FastGL's greedy): start from batch 0 (of the already shuffled list), then repeatedly
append the unvisited batch with the highest match degree to the current one (ties: lowest index).
Match degree: |A ∩ B| ("intersection", = rows saved) or |A ∩ B| / |A ∪ B| ("jaccard"). The greedy
path is a heuristic: when its total overlap (the rows reuse saves) is lower than that of the given
order, the given order is kept, so reordering never increases the rows fetched.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["overlap_matrix", "overlap_matrix_torch", "match_reorder", "fetch_cost", "ResidentCache", "MATCH_METRICS"]

MATCH_METRICS = ("intersection", "jaccard")


def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


#: elements of one dense [n_batches, columns] incidence chunk on a GPU (float32: 256 MiB)
OVERLAP_CHUNK_ELEMS = 1 << 26


def overlap_matrix(node_sets: Sequence, num_nodes: int | None = None) -> np.ndarray:
    """int64 [n, n]: |S_i ∩ S_j| of the node sets (each int64 ids, unique within a set); the diagonal
    holds |S_i|. The product of the batch-by-node incidence matrix with its transpose: on the GPU
    when the sets are CUDA tensors (`overlap_matrix_torch`, only the [n, n] result is copied to
    the host), else one scipy sparse product."""
    if node_sets and all(isinstance(s, torch.Tensor) and s.is_cuda for s in node_sets):
        return overlap_matrix_torch(node_sets, num_nodes).cpu().numpy()
    sets = [_np(s).astype(np.int64, copy=False) for s in node_sets]
    n = len(sets)
    if n == 0:
        return np.zeros((0, 0), dtype=np.int64)
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    cols = np.concatenate(sets) if sizes.sum() else np.zeros(0, np.int64)
    if num_nodes is None:
        num_nodes = int(cols.max()) + 1 if cols.size else 1
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=indptr[1:])
    import scipy.sparse as sp  # imported on first use: slow to import

    inc = sp.csr_matrix((np.ones(len(cols), np.int64), cols, indptr), shape=(n, num_nodes))
    return np.asarray((inc @ inc.T).toarray(), dtype=np.int64)


def overlap_matrix_torch(node_sets: Sequence[torch.Tensor], num_nodes: int | None = None,
                         chunk_elems: int = OVERLAP_CHUNK_ELEMS) -> torch.Tensor:
    """`overlap_matrix` on the sets' device: int64 [n, n] tensor.

    The node ids are cut into column ranges of at most `chunk_elems // n` ids (and at most 2^24,
    so float32 sums of 0/1 stay exact); per range a dense float32 0/1 incidence chunk [n, C] is
    filled by one scatter and multiplied with its transpose (one GEMM), and the counts are summed
    in int64. Memory: n * C * 4 bytes at a time."""
    n = len(node_sets)
    dev = node_sets[0].device if n else torch.device("cpu")
    if n == 0:
        return torch.zeros((0, 0), dtype=torch.int64, device=dev)
    cols = torch.cat([s.reshape(-1).to(torch.int64) for s in node_sets])
    rows = torch.repeat_interleave(torch.arange(n, device=dev),
                                   torch.tensor([s.numel() for s in node_sets], device=dev))
    if num_nodes is None:
        num_nodes = int(cols.max()) + 1 if cols.numel() else 1
    width = max(1, min(num_nodes, chunk_elems // n, 1 << 24))
    out = torch.zeros((n, n), dtype=torch.int64, device=dev)
    if cols.numel() == 0:
        return out
    order = torch.argsort(cols)  # ids sorted once, so each chunk is a contiguous slice
    cols, rows = cols[order], rows[order]
    bounds = torch.searchsorted(cols, torch.arange(0, num_nodes + width, width, device=dev)).tolist()
    inc = torch.empty((n, width), dtype=torch.float32, device=dev)
    for k, c0 in enumerate(range(0, num_nodes, width)):
        a, b = bounds[k], bounds[k + 1]
        if a == b:
            continue
        inc.zero_()
        inc[rows[a:b], cols[a:b] - c0] = 1.0
        out += torch.round(inc @ inc.T).to(torch.int64)
    return out


def match_reorder(node_sets: Sequence, metric: str = "intersection", start: int = 0,
                  overlap: np.ndarray | None = None) -> list[int]:
    """Greedy Match-Reorder: a permutation of range(len(node_sets)) whose consecutive batches overlap
    most (see module doc). `overlap` may pass a precomputed `overlap_matrix`."""
    if metric not in MATCH_METRICS:
        raise ValueError(f"metric must be one of {MATCH_METRICS}, got {metric!r}")
    n = len(node_sets)
    if n == 0:
        return []
    if not 0 <= start < n:
        raise ValueError(f"start must be in [0, {n}), got {start}")
    o = overlap_matrix(node_sets) if overlap is None else overlap
    score = o.astype(np.float64)
    if metric == "jaccard":
        d = np.diag(o).astype(np.float64)
        union = d[:, None] + d[None, :] - score
        score = np.divide(score, union, out=np.zeros_like(score), where=union > 0)
    visited = np.zeros(n, dtype=bool)
    order = [start]
    visited[start] = True
    cur = start
    for _ in range(n - 1):
        row = np.where(visited, -np.inf, score[cur])
        cur = int(np.argmax(row))  # first maximum: lowest index on ties
        visited[cur] = True
        order.append(cur)
    if fetch_cost(o, order) > fetch_cost(o, range(n)):
        return list(range(n))  # never worse than the order given
    return order


def fetch_cost(overlap: np.ndarray, order: Sequence[int]) -> int:
    """Rows fetched when the batches run in `order` with reuse of the previous batch's rows:
    |S_o0| + sum_k (|S_ok| - |S_ok ∩ S_o(k-1)|)."""
    order = list(order)
    if not order:
        return 0
    d = np.diag(overlap)
    total = int(d[order[0]])
    for a, b in zip(order[:-1], order[1:]):
        total += int(d[b] - overlap[a, b])
    return total


class ResidentCache:
    """The previous batch's features, reused by the next gather.

    `gather(n_id, source)` returns float32 [U, F] for n_id: rows whose id was in the previous batch
    are copied from the resident tensor (located by binary search in its sorted ids), the others
    are read from `source` (a FeatureSource) in one gather; the result becomes the new resident set.
    Counters: rows_fetched / rows_reused of the last call and in total.
    """

    def __init__(self):
        self.ids_sorted: torch.Tensor | None = None
        self.order: torch.Tensor | None = None
        self.x: torch.Tensor | None = None
        self.last_fetched = self.last_reused = 0
        self.total_fetched = self.total_reused = 0

    def clear(self) -> None:
        self.ids_sorted = self.order = self.x = None

    def lookup(self, n_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hit bool [U], resident row int64 [U] valid where hit) of n_id in the resident set."""
        if self.ids_sorted is None or self.ids_sorted.numel() == 0 or n_id.numel() == 0:
            return (torch.zeros(n_id.numel(), dtype=torch.bool, device=n_id.device),
                    torch.zeros(n_id.numel(), dtype=torch.int64, device=n_id.device))
        ids = n_id.to(self.ids_sorted.device)
        pos = torch.searchsorted(self.ids_sorted, ids).clamp_(max=self.ids_sorted.numel() - 1)
        hit = self.ids_sorted[pos] == ids
        return hit, self.order[pos]

    def gather(self, n_id: torch.Tensor, source, checked: bool = False) -> torch.Tensor:
        """float32 [U, F] rows of n_id, the misses read from `source` (FeatureSource.gather's
        `checked`: ids known to be in range)."""
        n_id = torch.as_tensor(n_id, dtype=torch.int64)
        hit, res_row = self.lookup(n_id)
        u = n_id.numel()
        out = torch.empty((u, source.dim), dtype=torch.float32, device=source.device)
        miss = torch.nonzero(~hit).flatten()
        if miss.numel() == u:
            out = source.gather(n_id, checked=checked)
        else:
            if miss.numel():
                out[miss.to(out.device)] = source.gather(n_id[miss], checked=checked)
            sel = torch.nonzero_static(hit, size=u - miss.numel()).flatten()  # size known: no second sync
            out[sel.to(out.device)] = self.x[res_row[sel].to(self.x.device)].to(out.device)
        self.last_fetched, self.last_reused = int(miss.numel()), int(u - miss.numel())
        self.total_fetched += self.last_fetched
        self.total_reused += self.last_reused
        self.ids_sorted, self.order = torch.sort(n_id)
        self.x = out
        return out
