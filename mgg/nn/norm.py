"""DistBatchNorm: batch normalisation over all nodes of the distributed graph (every rank's rows).

The batch is the whole graph, split over ranks: each rank sums its rows (sum, sum of squares,
count, in float64) and one all-reduce over the DistGraph's communicator gives the global
statistics, so P ranks normalise with exactly the statistics a 1-rank run computes. The
all-reduce is differentiable (its backward all-reduces the gradient of the statistics), so the
gradient of every rank's rows is the 1-rank gradient too. Training: one all-reduce forward and
one backward per call (collective: every rank calls it, also a rank with no rows). Evaluation:
the running statistics, no communication.

On a GPU the rows go through torch's fused batch-norm kernels instead of the float64 sums: one
rank calls F.batch_norm; several ranks run SyncBatchNorm's kernels (per-rank mean and inverse
std, combined over ranks; backward_reduce / backward_elemt) with the two small sums over ranks
done by the store on the device where it can (NVSHMEM), so the step has no host sync and can be
captured in a CUDA graph. The float64 form stays the CPU path (its statistics are what CI checks
P ranks against 1 rank with).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DistBatchNorm", "allreduce_sum", "combine_rank_stats", "make_norm", "NORMS"]

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


def _sum_over_ranks(buf: torch.Tensor, dg) -> torch.Tensor:
    """buf (float32, 1-D, CUDA) summed over the ranks of dg: on the device through the store where
    it can (NVSHMEM's on-stream reduction), else on the host in float64. Collective."""
    store = getattr(dg, "store", None)
    if store is not None and store.allreduce_sum_(buf):
        return buf
    host = buf.detach().to("cpu", torch.float64).numpy().copy()
    dg.comm.allreduce_(host)
    return torch.from_numpy(host).to(buf.device, buf.dtype)


def combine_rank_stats(means: torch.Tensor, invstds: torch.Tensor, counts: torch.Tensor, n: float,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and biased variance (float64 [D]) of all rows from each rank's own: means and
    inverse stds (float [P, D], as torch.batch_norm_stats gives them: invstd = 1 / sqrt(var_r +
    eps)), row counts (float64 [P], a rank without rows counts 0 whatever its entries) and their
    sum n. Chan's parallel formula, N var = sum_r n_r (var_r + (mean_r - mean)^2), in float64."""
    means, invstds = means.to(torch.float64), invstds.to(torch.float64)
    var_r = (1.0 / (invstds * invstds) - eps).clamp(min=0.0)
    w = counts.to(torch.float64)[:, None]
    mean = (w * means).sum(0) / n
    return mean, (w * (var_r + (means - mean) ** 2)).sum(0) / n


class _SyncBatchNormGPU(torch.autograd.Function):
    """Batch norm over the rows of every rank with torch's SyncBatchNorm kernels, or with the
    ReLU after it folded in (`relu`: mgg.kernels.norm_relu).

    Forward: each rank's mean and inverse std (torch.batch_norm_stats, float32 [D]) go into its
    row of a zeroed [P, 2D] buffer summed over ranks (an all-gather; none at P = 1); the global
    mean and biased variance are combined from them in float64 with the host-known row counts
    (Chan's parallel formula: sum_r n_r (var_r + (mean_r - mean)^2) / N). Backward:
    torch.batch_norm_backward_reduce (or bn_relu_backward_reduce, the gradient masked by the
    ReLU recomputed from x) gives this rank's sum(dy), sum(dy (x - mean)) and the affine gradients
    (this rank's rows; the gradient all-reduce sums them); the two [D] sums are summed over ranks,
    then torch.batch_norm_backward_elemt (or bn_relu_backward_elemt) writes dx. `index` (int64
    [k] distinct rows, or None): only those rows are transformed and returned (statistics of
    all). `local_stats` (None, or this rank's column mean and biased variance of x, float [D]
    each, from the op that wrote x: mgg.nn.dense.linear_with_stats) stands in for
    torch.batch_norm_stats, a pass over x. Shapes: x float32 [n_local, D] (contiguous CUDA). dg
    None: one process."""

    @staticmethod
    def forward(ctx, x, weight, bias, bn, dg, counts, relu, index=None, local_stats=None):  # type: ignore[override]
        mean32, invstd32, count32, n, p = gpu_batch_stats(x, bn, dg, counts, local_stats)
        rows = x if index is None else x[index]  # the rows written (statistics: all of x)
        # the gathered rows are kept for the backward (a second gather cost 0.12 ms at 196,615 x 64)
        ctx.save_for_backward(x, weight, bias, mean32, invstd32, index, None if index is None else rows)
        ctx.dg, ctx.count, ctx.n, ctx.relu, ctx.world = dg, count32, n, relu, p
        if rows.shape[0] == 0:  # torch's kernel refuses an empty input; this rank still took part above
            return x.new_empty(rows.shape)
        if relu:
            from ..kernels.norm_relu import bn_relu_forward

            return bn_relu_forward(rows, mean32, invstd32, weight, bias)
        return torch.batch_norm_elemt(rows, weight, bias, mean32, invstd32, bn.eps)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        """With an index (only those rows written; grad float32 [len(index), D], distinct rows)
        the gradient is 0 at every other row, so the two sums run over the rows written, and
        dx = w invstd (dy - sum_dy / N - (x - mean) invstd^2 sum_dy_xmu / N) is the per-column
        affine map a x + c at every other row (one pass); the rows written get the batch-norm
        (+ ReLU) backward kernels' own values."""
        x, weight, bias, mean, invstd, index, gathered = ctx.saved_tensors
        gx, gw, gb = gpu_norm_backward(ctx, grad, x, weight, bias, mean, invstd, index, gathered)
        return gx, gw, gb, None, None, None, None, None, None


def gpu_batch_stats(x: torch.Tensor, bn: "DistBatchNorm", dg, counts: np.ndarray, local_stats=None):
    """The training statistics of batch norm `bn` over the rows x (float32 [n_local, D], CUDA) of
    every rank, as _SyncBatchNormGPU's forward computes them (running statistics updated):
    (mean, invstd: float32 [D]; the row counts int32 [P] on x's GPU; N; P). Collective with
    several ranks."""
    d = x.shape[1]
    p, r = (1, 0) if dg is None else (dg.world_size, dg.rank)
    buf = x.new_zeros(p, 2 * d)
    if x.shape[0] > 0 and local_stats is not None:  # this rank's, from the op that wrote x
        mean_r, var_r = local_stats
        buf[r, :d], buf[r, d:] = mean_r, torch.rsqrt(var_r + bn.eps)
    elif x.shape[0] > 0:
        mean_r, invstd_r = torch.batch_norm_stats(x, bn.eps)
        buf[r, :d], buf[r, d:] = mean_r, invstd_r
    else:  # an empty rank: weight 0 in the combination (invstd 1 keeps its variance finite)
        buf[r, d:] = 1.0
    if p > 1:
        buf = _sum_over_ranks(buf.view(-1), dg).view(p, 2 * d)
    n_r, count32 = bn._device_counts(counts, x.device)
    n = float(counts.sum())
    mean, var = combine_rank_stats(buf[:, :d], buf[:, d:], n_r, n, bn.eps)
    bn._update_running(mean, var, n)
    return mean.to(x.dtype), torch.rsqrt(var + bn.eps).to(x.dtype), count32, n, p


def gpu_norm_backward(ctx, grad: torch.Tensor, x: torch.Tensor, weight, bias, mean: torch.Tensor,
                      invstd: torch.Tensor, index=None, gathered=None):
    """(grad x, grad weight, grad bias) of _SyncBatchNormGPU's forward (ctx: its `needs_input_grad`
    [x, weight, bias first], `relu`, `dg`, `world`, `n`, `count`) for grad float32 [rows written,
    D]. Collective with several ranks when x needs its gradient."""
    grad = grad.contiguous()
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    d = x.shape[1]
    rows = x if index is None else gathered  # the rows grad belongs to
    gw = gb = None
    if rows.shape[0] == 0:
        sum_dy = sum_dy_xmu = x.new_zeros(d)
        gw = gb = None if weight is None else torch.zeros_like(weight)
    elif ctx.relu:
        from ..kernels.norm_relu import bn_relu_backward_reduce

        sum_dy, sum_dy_xmu = bn_relu_backward_reduce(grad, rows, mean, invstd, weight, bias)
        if weight is not None:  # what batch_norm_backward_reduce returns for them
            gw, gb = sum_dy_xmu * invstd, sum_dy.clone()
    else:
        sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(
            grad, rows, mean, invstd, weight, need_x, need_w and weight is not None,
            need_b and weight is not None)
    gx = None
    if need_x:  # every rank reaches this (all need x's gradient), so the sum is collective
        sums = torch.cat([sum_dy, sum_dy_xmu])
        if ctx.world > 1:
            sums = _sum_over_ranks(sums, ctx.dg)
        if rows.shape[0] == 0:
            gx = torch.zeros_like(rows)
        elif ctx.relu:
            from ..kernels.norm_relu import bn_relu_backward_elemt

            gx = bn_relu_backward_elemt(grad, rows, mean, invstd, weight, bias, sums[:d], sums[d:], ctx.n)
        else:
            gx = torch.batch_norm_backward_elemt(grad, rows, mean, invstd, weight, sums[:d], sums[d:], ctx.count)
        if index is not None:
            gx = _scatter_rows(gx, index, x, mean, invstd, weight, sums[:d], sums[d:], ctx.n)
    return gx, (gw if need_w else None), (gb if need_b else None)


def _scatter_rows(g_rows: torch.Tensor, index: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                  invstd: torch.Tensor, weight: torch.Tensor | None, sum_dy: torch.Tensor,
                  sum_dy_xmu: torch.Tensor, n: float) -> torch.Tensor:
    """dx float32 [n_local, D] of a batch norm whose output was read at rows `index` alone:
    g_rows [len(index), D] at those rows, and at every other row (where dy = 0) the per-column
    map a x + c, a = -w invstd^3 sum_dy_xmu / n, c = -w invstd sum_dy / n - a mean."""
    scale = invstd if weight is None else weight * invstd
    a = -scale * invstd * invstd * sum_dy_xmu / n
    c = -scale * sum_dy / n - a * mean
    if x.shape[0] == 0:
        return torch.zeros_like(x)
    # a x + c as batch norm's transform (mean 0, invstd 1, weight a, bias c): mgg's kernel where it
    # takes the rows (0.33 ms at [2.45M, 64] on an H200), else torch's channel kernel (0.44 ms;
    # torch.addcmul of a broadcast [D] is not vectorised: 0.48 ms)
    zero, one = torch.zeros_like(a), torch.ones_like(a)
    if DistBatchNorm._fusable(x):
        from ..kernels.norm_relu import bn_relu_forward

        gx = bn_relu_forward(x.contiguous(), zero, one, a.contiguous(), c.contiguous(), relu=False)
    else:
        gx = torch.batch_norm_elemt(x.contiguous(), a, c, zero, one, 0.0)
    if g_rows.shape[0]:
        gx.index_copy_(0, index, g_rows)
    return gx


class DistBatchNorm(nn.Module):
    """BatchNorm1d over the rows of all ranks (torch.nn.BatchNorm1d semantics on the concatenation).

    y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance over all N rows of
    the graph while training; running_mean / running_var (unbiased, N / (N - 1)) are updated with
    `momentum` (None: cumulative average) and used in eval mode.

    `forward(x, dg, relu=True)` returns relu(batch_norm(x)): on a GPU while training (float32
    rows, D = 4 * 2^k <= 1024) one kernel applies both and the backward recomputes the ReLU's
    mask from x (mgg.kernels.norm_relu), so the normalised rows are never written and read back
    (GINConv passes `relu=True` when a ReLU follows this stage); elsewhere it is the two steps.

    Args:
        num_features: D. eps, momentum, affine, track_running_stats: as in torch.nn.BatchNorm1d.
        fuse_relu: allow the fused kernels for `relu=True` (False: always the two steps; for
            comparisons).
    Shapes:
        forward(x float [n_local, D], dg) -> float [n_local, D]; `dg` is the DistGraph (its `comm`
        is used; dg=None means a single process).
    """

    needs_graph = True  # GINConv passes the DistGraph to this stage
    takes_relu = True   # ... and `relu=True` when a ReLU follows it
    takes_rows = True   # ... and `rows=` when only some rows of the output are read
    takes_stats = True  # ... and `local_stats=` when the Linear before it summed its columns

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, fuse_relu: bool = True):
        super().__init__()
        self.fuse_relu = bool(fuse_relu)
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

    def _momentum(self) -> float:
        """This step's running-average factor (call after counting the batch)."""
        return 1.0 / float(self.num_batches_tracked) if self.momentum is None else float(self.momentum)

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        """Fold the batch's mean and biased variance (over n rows) into the running statistics."""
        if not (self.training and self.track_running_stats):
            return
        with torch.no_grad():
            self.num_batches_tracked += 1
            m = self._momentum()
            unbiased = var.detach() * (n / max(n - 1.0, 1.0))
            self.running_mean.mul_(1 - m).add_(mean.detach().to(self.running_mean.dtype), alpha=m)
            self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)

    def _device_counts(self, counts: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`counts` on `device` as float64 and int32 [P], uploaded once (a pageable upload inside
        a CUDA-graph capture would fail)."""
        key = (str(device), counts.tobytes())
        cache = self.__dict__.setdefault("_counts_on_device", {})
        if key not in cache:
            cache[key] = (torch.as_tensor(counts, dtype=torch.float64).to(device),
                          torch.as_tensor(counts.astype(np.int32)).to(device))
        return cache[key]

    def _gpu_counts(self, x: torch.Tensor, dg) -> np.ndarray | None:
        """Every rank's row count (int64 [P], from the partition bounds) for float32 rows on a GPU
        of a DistGraph, else None (the float64 path then runs: the same choice on every rank).
        ValueError when x does not hold exactly this rank's rows (every rank must take the same
        path: a rank going its own way would leave the others waiting in a collective)."""
        bounds = getattr(dg, "bounds", None)
        if not x.is_cuda or bounds is None or x.dtype != torch.float32:
            return None
        counts = np.diff(np.asarray(bounds, dtype=np.int64))
        if x.shape[0] != counts[dg.rank]:
            raise ValueError(f"DistBatchNorm: rank {dg.rank} got {x.shape[0]} rows, its partition has "
                             f"{counts[dg.rank]}: batch norm runs over every row of every rank")
        return counts

    def uses_local_stats(self, x: torch.Tensor, dg=None, relu: bool = False, rows: bool = False) -> bool:
        """Whether `forward(x', dg, relu, rows=...)` on rows x' shaped and placed like x would take
        `local_stats` (the GPU path of training statistics; every other path computes its own):
        the op writing x' then need not sum its columns. `rows`: whether rows= will be given."""
        if not (self.training or not self.track_running_stats) or not x.is_cuda:
            return False
        comm = None if dg is None else dg.comm
        if comm is None or comm.size == 1:
            fused = relu and self.fuse_relu and self._fusable(x)
            return fused or (rows and x.dtype == torch.float32)
        return getattr(dg, "bounds", None) is not None and x.dtype == torch.float32

    def fuses_linear(self, x: torch.Tensor, dg=None) -> bool:
        """Whether `forward(x', dg, relu=True)` on rows x' shaped and placed like x runs the GPU path
        whose statistics and backward mgg.nn.norm_linear reuses (training statistics, float32 CUDA
        rows, the fused ReLU kernels; every rank's rows from a DistGraph's bounds at P > 1): a
        Linear reading relu(bn(x)) may then apply the norm inside its GEMM. Decided from values
        every rank shares."""
        if not (self.training or not self.track_running_stats) or not self.fuse_relu:
            return False
        if not (x.is_cuda and x.dtype == torch.float32 and self._fusable(x)):
            return False
        comm = None if dg is None else dg.comm
        return comm is None or comm.size == 1 or getattr(dg, "bounds", None) is not None

    def gpu_counts(self, x: torch.Tensor, dg=None) -> np.ndarray:
        """Every rank's row count (int64 [P]) for the GPU path (`fuses_linear`); ValueError when
        the graph has no rows or x does not hold this rank's."""
        comm = None if dg is None else dg.comm
        counts = np.array([x.shape[0]], dtype=np.int64) if comm is None or comm.size == 1 else self._gpu_counts(x, dg)
        if counts is None or counts.sum() < 1:
            raise ValueError("DistBatchNorm: the graph has no rows to normalise")
        return counts

    def stats_shift(self, device: torch.device) -> torch.Tensor:
        """float32 [D] on `device`: a value near each column's mean for an op that sums x's
        columns for this norm (`local_stats`): the running mean when tracked, else zeros."""
        if self.track_running_stats and self.running_mean.device == device:
            return self.running_mean
        return torch.zeros(self.num_features, device=device)

    def forward(self, x: torch.Tensor, dg=None, relu: bool = False, rows: torch.Tensor | None = None,
                local_stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x float [n_local, D] -> batch_norm(x), or relu(batch_norm(x)) with `relu`. Collective
        while training with several ranks. `rows` (int64 [k] distinct local rows, on x's device):
        only those rows of the result, float [k, D], in that order; the statistics are still
        those of every row (and the gradient reaches every row of x through them). On a GPU
        only the k rows are transformed. `local_stats`: this rank's column mean and biased
        variance of x (float64 [D] each), computed by the op that wrote x; the GPU path uses
        them instead of a pass over x (others compute their own)."""
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"DistBatchNorm: expected [n, {self.num_features}] input, got {tuple(x.shape)}")
        use_batch = self.training or not self.track_running_stats
        comm = None if dg is None else dg.comm
        fused = relu and use_batch and self.fuse_relu and self._fusable(x)
        if use_batch and x.is_cuda and (comm is None or comm.size == 1):
            if x.shape[0] < 1:
                raise ValueError("DistBatchNorm: the graph has no rows to normalise")
            if fused or (rows is not None and x.dtype == torch.float32):
                # statistics, then the transform (and the ReLU: one kernel) of the rows written
                out = _SyncBatchNormGPU.apply(x.contiguous(), self.weight, self.bias, self, None,
                                              np.array([x.shape[0]], dtype=np.int64), fused, rows, local_stats)
                return torch.relu(out) if relu and not fused else out
            track = self.training and self.track_running_stats
            if track:
                self.num_batches_tracked += 1
            out = F.batch_norm(x, self.running_mean if track else None, self.running_var if track else None,
                               self.weight, self.bias, True, self._momentum() if track else 0.0, self.eps)
            out = out if rows is None else out[rows]
            return torch.relu(out) if relu else out
        counts = self._gpu_counts(x, dg) if use_batch and comm is not None else None
        if counts is not None:
            if counts.sum() < 1:
                raise ValueError("DistBatchNorm: the graph has no rows to normalise")
            out = _SyncBatchNormGPU.apply(x.contiguous(), self.weight, self.bias, self, dg, counts, fused, rows,
                                          local_stats)
            return torch.relu(out) if relu and not fused else out
        if use_batch:
            mean, var, n = self._global_stats(x, dg)
            self._update_running(mean, var, n)
            mean, inv = mean.to(x.dtype), torch.rsqrt(var + self.eps).to(x.dtype)
        else:
            mean, inv = self.running_mean.to(x.dtype), torch.rsqrt(self.running_var + self.eps).to(x.dtype)
        out = ((x if rows is None else x[rows]) - mean) * inv
        if self.affine:
            out = out * self.weight + self.bias
        return torch.relu(out) if relu else out

    @staticmethod
    def _fusable(x: torch.Tensor) -> bool:
        """Whether the fused batch-norm + ReLU kernels take x (decided from values every rank
        shares: dtype, device type, width)."""
        if not x.is_cuda:
            return False
        from ..kernels.norm_relu import supports

        return supports(x)

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
