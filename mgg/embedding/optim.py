"""Sparse optimizers applied at the owning rank (state sharded like the table).

`step()` is collective: it calls `reduce_gradients()` ((row, grad) to the owners: MPI on the CPU
store, NVSHMEM on the device on the GPU store), updates the rows this rank owns in its slice of the
symmetric array, and publishes the slice.

* `SparseSGD`: w[r] -= lr * g[r] for every row with a gradient (torch.optim.SGD on a sparse
  gradient, no momentum).
* `RowWiseAdagrad` (FBGEMM/TorchRec's EXACT_ROWWISE_ADAGRAD): one accumulator per row,
  s[r] += mean_j g[r, j]^2 over the table's D columns; w[r] -= lr * g[r] / (sqrt(s[r]) + eps).

`step(fixed=True)` (GPU store) takes the gradient of one forward in its fixed shape
(`reduce_gradients_fixed`: rows with -1 where nothing) and updates under a mask: every place
is written, the places without a row at row 0 with a zero update, and nothing is read back to
the host, so a step replayed from a CUDA graph can run it. The valid rows are unique, so the
masked update is the same arithmetic as the update of the unique rows.
"""
from __future__ import annotations

import torch

from .bag import MultiTableEmbeddingBag, SparseRowGrad

__all__ = ["SparseSGD", "RowWiseAdagrad"]


class _ShardedOptimizer:
    def __init__(self, module: MultiTableEmbeddingBag, lr: float):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.module, self.lr = module, float(lr)

    def zero_grad(self) -> None:
        self.module.clear_gradients()

    def step(self, fixed: bool = False) -> SparseRowGrad:
        """Collective: exchange gradients, update my rows, publish. Returns the applied gradient.
        fixed: the fixed-shape, sync-free path (GPU store, one pending forward; see the module)."""
        grad = self.module.reduce_gradients_fixed() if fixed else self.module.reduce_gradients()
        # other PEs' lookups may still be reading my rows on their streams (a GPU lookup with
        # checks "deferred" returns before its kernel ends): every PE done reading before I write
        self.module.array.release()
        if fixed:
            with torch.no_grad():
                loc = self.module.array.local
                valid = grad.rows >= 0
                rows = torch.where(valid, grad.rows, torch.zeros_like(grad.rows))
                self._apply_masked(loc, rows, grad.values.to(loc.dtype), valid)
        elif len(grad.rows):
            with torch.no_grad():
                loc = self.module.array.local
                rows = grad.rows if isinstance(grad.rows, torch.Tensor) else torch.from_numpy(grad.rows)
                self._apply(loc, rows.to(loc.device), grad.values.to(loc.device, loc.dtype))
        self.module.array.publish()
        return grad

    def _apply(self, loc, rows, g) -> None:
        """Update my slice `loc` at local rows `rows` (int64 [k], unique) with their gradient g [k, Dmax]."""
        raise NotImplementedError

    def _apply_masked(self, loc, rows, g, valid) -> None:
        """`_apply` on places `rows` (int64 [m], 0 where not `valid`, the valid ones unique) with
        gradient g [m, Dmax], where `valid` (bool [m]) says which places hold a row."""
        raise NotImplementedError


class SparseSGD(_ShardedOptimizer):
    """Plain SGD on the rows that received a gradient."""

    def _apply(self, loc, rows, g) -> None:
        loc.index_add_(0, rows, g, alpha=-self.lr)

    def _apply_masked(self, loc, rows, g, valid) -> None:
        loc.index_add_(0, rows, torch.where(valid.unsqueeze(1), g, torch.zeros_like(g)), alpha=-self.lr)


class RowWiseAdagrad(_ShardedOptimizer):
    """Row-wise Adagrad; `state` holds one accumulator per local row of this rank's slice."""

    def __init__(self, module: MultiTableEmbeddingBag, lr: float = 0.01, eps: float = 1e-10,
                 initial_accumulator_value: float = 0.0):
        super().__init__(module, lr)
        if eps < 0 or initial_accumulator_value < 0:
            raise ValueError("eps and initial_accumulator_value must be >= 0")
        self.eps = float(eps)
        self.state = torch.full((module.layout.rows_per_pe,), float(initial_accumulator_value),
                                dtype=module.dtype, device=module.array.local.device)

    def _apply(self, loc, rows, g) -> None:
        dims = self.module.row_dims(rows).to(g.dtype)
        s = self.state.index_select(0, rows) + (g * g).sum(1) / dims
        self.state.index_copy_(0, rows, s)
        step = g * (self.lr / (s.sqrt() + self.eps)).unsqueeze(1)
        loc.index_add_(0, rows, step, alpha=-1.0)

    def _apply_masked(self, loc, rows, g, valid) -> None:
        dims = self.module.row_dims(rows).to(g.dtype)
        zero = torch.zeros((), dtype=g.dtype, device=g.device)
        self.state.index_add_(0, rows, torch.where(valid, (g * g).sum(1) / dims, zero))
        s = self.state.index_select(0, rows)
        # s + eps == 0 only where the gradient is 0 (a held step, eps 0): no update there, not 0 * inf
        scale = torch.where(valid & (s + self.eps > 0), self.lr / (s.sqrt() + self.eps), zero)
        loc.index_add_(0, rows, g * scale.unsqueeze(1), alpha=-1.0)
