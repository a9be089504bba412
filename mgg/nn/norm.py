"""DistBatchNorm: batch normalisation over all nodes of the distributed graph (every rank's rows).

The batch is the whole graph, split over ranks: each rank sums its rows (sum, sum of squares,
count, in float64) and one all-reduce over the DistGraph's communicator gives the global
statistics, so P ranks normalise with exactly the statistics a 1-rank run computes. The
all-reduce is differentiable (its backward all-reduces the gradient of the statistics), so the
gradient of every rank's rows is the 1-rank gradient too. Training: one all-reduce forward and
one backward per call (collective: every rank calls it, also a rank with no rows). Evaluation:
the running statistics, no communication.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["DistBatchNorm", "allreduce_sum", "make_norm", "NORMS"]

NORMS = ("batch", "layer", "none")


class _AllReduceSum(torch.autograd.Function):
    """out = sum over ranks of t (float64 [k], host all-reduce); backward: the same on the gradient."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, comm) -> torch.Tensor:  # type: ignore[override]
        ctx.comm = comm
        return _allreduce(t, comm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _allreduce(grad, ctx.comm), None


def _allreduce(t: torch.Tensor, comm) -> torch.Tensor:
    if comm is None or comm.size == 1:
        return t.detach().clone()
    buf = t.detach().to("cpu", torch.float64).contiguous().numpy().copy()
    comm.allreduce_(buf)
    return torch.from_numpy(buf).to(t.device, t.dtype)


def allreduce_sum(t: torch.Tensor, comm) -> torch.Tensor:
    """Differentiable sum of a small tensor over the ranks of `comm` (mgg Communicator or None)."""
    return _AllReduceSum.apply(t, comm)


class DistBatchNorm(nn.Module):
    """BatchNorm1d over the rows of all ranks (torch.nn.BatchNorm1d semantics on the concatenation).

    y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance over all N rows of
    the graph while training; running_mean / running_var (unbiased, N / (N - 1)) are updated with
    `momentum` (None: cumulative average) and used in eval mode.

    Args:
        num_features: D. eps, momentum, affine, track_running_stats: as in torch.nn.BatchNorm1d.
    Shapes:
        forward(x float [n_local, D], dg) -> float [n_local, D]; `dg` is the DistGraph (its `comm`
        is used; dg=None means a single process).
    """

    needs_graph = True  # GINConv passes the DistGraph to this stage

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True):
        super().__init__()
        if num_features < 1:
            raise ValueError(f"DistBatchNorm: num_features must be >= 1, got {num_features}")
        self.num_features, self.eps, self.momentum = num_features, float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_parameters(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1.0)
            self.num_batches_tracked.zero_()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def _global_stats(self, x: torch.Tensor, dg) -> tuple[torch.Tensor, torch.Tensor, float]:
        """mean, biased var (float64 [D], differentiable) and N over all ranks' rows."""
        xd = x.to(torch.float64)
        comm = None if dg is None else dg.comm
        d = self.num_features
        sums = torch.cat([xd.sum(0), (xd * xd).sum(0)])
        if comm is None or comm.size == 1:  # the count is known on the host: no device sync
            tot, n = sums, float(x.shape[0])
        else:  # the count travels with the sums (their all-reduce goes through the host anyway)
            tot = allreduce_sum(torch.cat([sums, xd.new_full((1,), float(x.shape[0]))]), comm)
            n = float(tot[2 * d].item())
        if n < 1:
            raise ValueError("DistBatchNorm: the graph has no rows to normalise")
        mean = tot[:d] / n
        var = (tot[d: 2 * d] / n - mean * mean).clamp(min=0.0)
        return mean, var, n

    def forward(self, x: torch.Tensor, dg=None) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"DistBatchNorm: expected [n, {self.num_features}] input, got {tuple(x.shape)}")
        use_batch = self.training or not self.track_running_stats
        if use_batch:
            mean, var, n = self._global_stats(x, dg)
            if self.training and self.track_running_stats:
                with torch.no_grad():
                    self.num_batches_tracked += 1
                    m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                         else float(self.momentum))
                    unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                    self.running_mean.mul_(1 - m).add_(mean.detach().to(self.running_mean.dtype), alpha=m)
                    self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
            mean, inv = mean.to(x.dtype), torch.rsqrt(var + self.eps).to(x.dtype)
        else:
            mean, inv = self.running_mean.to(x.dtype), torch.rsqrt(self.running_var + self.eps).to(x.dtype)
        out = (x - mean) * inv
        if self.affine:
            out = out * self.weight + self.bias
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


def make_norm(norm: str, width: int) -> nn.Module | None:
    """The normalisation stage named `norm` ("batch" | "layer" | "none") for `width` features."""
    if norm == "batch":
        return DistBatchNorm(width)
    if norm == "layer":
        return nn.LayerNorm(width)
    if norm == "none":
        return None
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
