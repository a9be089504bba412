"""Differentiable distributed aggregation and a partition-independent dropout.

Both functions take a `DistGraph` (mgg.runtime) and work on this rank's rows only: tensors are
float32 [n_local, D] on `dg.device`. Every rank must call them in the same order (they are
collective, and so is the backward of `aggregate`).
"""
from __future__ import annotations

import torch

from ..graph.gcn_factors import WHOLE, GcnFactors
from .dropout_host import hash_uniform_host

__all__ = ["Aggregate", "AggregateRows", "aggregate", "aggregate_args", "global_dropout", "seeded_dropout", "draw_seed", "DeviceSeeds", "mix_seed", "hash_uniform", "hash_uniform_host",
           "hash_dropout_reference", "HashDropoutCUDA"]


class Aggregate(torch.autograd.Function):
    """out = W x (+ diag * x) over the distributed graph; backward: grad_x = W^T grad_out (+ diag).

    The forward runs the plan of `kind`, the backward the transposed plan (reverse graph), both
    collectives: autograd visits the Aggregate nodes of identical graphs in the same order on
    every rank, so the backward exchanges match up. With partial gcn `factors`
    (mgg.graph.gcn_factors) the forward applies those and the backward their transpose.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dg, kind: str, rows=None, factors: GcnFactors = WHOLE) -> torch.Tensor:  # type: ignore[override]
        ctx.dg, ctx.kind, ctx.rows, ctx.factors = dg, kind, rows, factors
        return dg.aggregate(x.detach().contiguous(), kind, **aggregate_args(rows, factors))

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        # d out / d x = diag(f)^r (A + I) diag(f)^c: its transpose swaps the factors
        grad_x = ctx.dg.aggregate(grad_out.contiguous(), ctx.kind, transposed=True,
                                  **aggregate_args(ctx.rows, ctx.factors.transpose()))
        return grad_x, None, None, None, None


def aggregate_args(rows, factors: GcnFactors) -> dict:
    """The keyword arguments of dg.aggregate beyond (x, kind, transposed): only those that differ
    from the plain call, so graphs that offer just `aggregate(x, kind, transposed)` (the
    single-GPU baselines of bench/baselines.py) run the plain calls."""
    extra = {} if rows is None else {"rows": rows}
    if not factors.whole:
        extra["factors"] = factors
    return extra


def takes_scaled_input(dg, kind: str, rows=None) -> bool:
    """dg.takes_scaled_input(kind, rows) (mgg.graph.DistGraph), False for a graph that offers only
    `aggregate(x, kind, transposed)` (bench/baselines.py)."""
    takes = getattr(dg, "takes_scaled_input", None)
    return bool(takes is not None and takes(kind, rows))


class AggregateRows(torch.autograd.Function):
    """`Aggregate` over a row set, returning its rows only (compact), for the gcn kind where the
    graph takes scaled input natively: the backward scatters the gradient rows of the set into
    the full table already times the column factor f, so its transposed aggregation runs on a
    scaled input (no pre-scale pass over every row). The same values as Aggregate's backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dg, kind: str, rows, factors: GcnFactors) -> torch.Tensor:  # type: ignore[override]
        ctx.dg, ctx.kind, ctx.rows, ctx.factors, ctx.n = dg, kind, rows, factors, x.shape[0]
        return dg.aggregate(x.detach().contiguous(), kind, **aggregate_args(rows, factors))[rows.index]

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        idx = ctx.rows.index
        full = grad_out.new_zeros(ctx.n, grad_out.shape[1])
        full[idx] = grad_out * ctx.dg.gcn_factor()[idx].to(grad_out.dtype).unsqueeze(1)
        # W_S^T g = diag(f)^c (A + I)_S^T (f g): the transpose on an input scaled by f
        grad_x = ctx.dg.aggregate(full, ctx.kind, transposed=True, rows=ctx.rows,
                                  factors=ctx.factors.transpose().on_scaled_input())
        return grad_x, None, None, None, None


def aggregate(x: torch.Tensor, dg, kind: str, rows=None, compact: bool = True,
              factors: GcnFactors = WHOLE) -> torch.Tensor:
    """Differentiable `dg.aggregate(x, kind)`, or its rows `rows` only.

    Args:
        x: float [n_local, D], this rank's node rows.
        dg: the DistGraph.
        kind: "sum" | "mean" | "gcn" | "sum_self" (see docs/architecture.md).
        rows: None, or a RowSet registered on dg (mgg.runtime.rowset).
        compact: with `rows`, return only those rows; False: every row, where only those of
            `rows` are meaningful (an inner layer's output, read by the next layer at them only).
        factors: "gcn" only, the part of diag(f) (A + I) diag(f) to apply (mgg.graph.gcn_factors).
            `SCALED_INPUT`: x holds dg.gcn_factor() * x (the column factor folded into the op
            that produced x, e.g. global_dropout(row_scale=)); the result is the aggregation of
            the unscaled rows, and the gradient is with respect to the scaled x. Saves the
            pre-scale pass where dg.takes_scaled_input("gcn").
    Returns:
        float [n_local, D], or float [len(rows), D]: the rows of `rows.index`, in that order.
    """
    if rows is None and factors.whole:
        return Aggregate.apply(x, dg, kind)
    if rows is not None and compact and kind == "gcn" and takes_scaled_input(dg, kind, rows):
        return AggregateRows.apply(x, dg, kind, rows, factors)
    out = Aggregate.apply(x, dg, kind, rows, factors)
    return out[rows.index] if (rows is not None and compact) else out


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) without int64 overflow (c split in 16-bit halves)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """The `lowbias32` integer hash (C. Wellons) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_uniform(rows: torch.Tensor, cols: int, seed: int) -> torch.Tensor:
    """Counter-based uniforms: float32 [len(rows), cols] in [0, 1), a pure function of
    (seed, global row id, column) -- the same value on any device and in any partition.

    Args: rows: int64 [n] global row ids (< 2^32). cols: width. seed: 64-bit int.
    """
    s1, s2 = seed & _M32, (seed >> 32) & _M32
    h_row = _hash32((rows.to(torch.int64) & _M32) ^ s1)                      # [n]
    col = torch.arange(cols, device=rows.device, dtype=torch.int64)
    h = _hash32(h_row[:, None] ^ ((col[None, :] * 0x9E3779B1 + s2) & _M32))  # [n, cols]
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


_M64 = (1 << 64) - 1


def mix_seed(counter: int) -> int:
    """The dropout seed of a DeviceSeeds counter value: splitmix64's finaliser (what the kernels
    compute on the GPU from the counter; consecutive counters give unrelated masks)."""
    z = counter & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


class DeviceSeeds:
    """Dropout seeds that live on the GPU, for a training step replayed from a CUDA graph.

    A host seed is a launch argument, which a graph would freeze. Here every `draw()` adds 1 to
    an int64 counter on the device (a kernel the graph records) and returns a copy of it
    (int64 CUDA [1]), which the dropout kernels read: their seed is mix_seed(counter). Each replay
    therefore drops new entries. The counter starts at a 62-bit value drawn from `generator`, so
    ranks seeded alike draw alike (P ranks still reproduce 1 rank). `get_state` / `set_state`
    (checkpoints) hold the counter as a uint8 [8] tensor, like a generator's state.
    """

    def __init__(self, generator: torch.Generator | None, device: torch.device | str):
        self.counter = torch.tensor([draw_seed(generator)], dtype=torch.int64, device=device)

    def draw(self) -> torch.Tensor:
        self.counter.add_(1)
        return self.counter.clone()

    def get_state(self) -> torch.Tensor:
        return self.counter.cpu().view(torch.uint8).clone()

    def set_state(self, state: torch.Tensor) -> None:
        if state.dtype != torch.uint8 or state.numel() != 8:
            raise ValueError(f"DeviceSeeds: a state is uint8 [8] (the counter), got {state.dtype} {tuple(state.shape)}")
        self.counter.copy_(state.view(torch.int64).to(self.counter.device))


def draw_seed(generator) -> int | torch.Tensor:
    """One dropout seed per call, on every rank alike: a 62-bit int from a CPU torch.Generator (or
    torch's default one for None); an int64 CUDA tensor [1] from a DeviceSeeds or a GPU's
    torch.Generator (drawn on the GPU: no host synchronisation; the kernels then use
    mix_seed(value))."""
    if isinstance(generator, DeviceSeeds):
        return generator.draw()
    if generator is not None and generator.device.type == "cuda":
        return torch.randint(0, 2 ** 62, (1,), generator=generator, device=generator.device)
    return int(torch.randint(0, 2 ** 62, (1,), generator=generator).item())


class HashDropoutCUDA(torch.autograd.Function):
    """x * keep / (1 - p) (* row_scale per row) by the fused kernel (mgg/kernels/dropout.cu); the
    backward regenerates the mask from (seed, row0): nothing but the seed (and the row_scale
    tensor, a constant) is kept between forward and backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed, row0: int,  # type: ignore[override]
                row_scale: torch.Tensor | None = None) -> torch.Tensor:
        from ..kernels.dropout_gpu import dropout_hash_cuda

        ctx.p, ctx.seed, ctx.row0, ctx.row_scale = p, seed, row0, row_scale
        return dropout_hash_cuda(x.detach(), p, seed, row0, row_scale)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        from ..kernels.dropout_gpu import dropout_hash_cuda

        return dropout_hash_cuda(grad_out, ctx.p, ctx.seed, ctx.row0, ctx.row_scale), None, None, None, None


def hash_dropout_reference(x: torch.Tensor, p: float, seed: int, row0: int) -> torch.Tensor:
    """The torch-op form of the hash dropout (int64 chunks of `hash_uniform`; any device):
    float [n, D] -> x * (hash_uniform(row0 + i, c, seed) >= p) / (1 - p). Tests and reference."""
    out = torch.empty_like(x)
    rows_per_chunk = max(1, (1 << 22) // max(1, x.shape[1]))  # bounded int64 temporaries
    for a in range(0, x.shape[0], rows_per_chunk):
        b = min(x.shape[0], a + rows_per_chunk)
        rows = torch.arange(row0 + a, row0 + b, device=x.device, dtype=torch.int64)
        keep = hash_uniform(rows, x.shape[1], seed) >= p
        out[a:b] = x[a:b] * keep.to(x.dtype) / (1.0 - p)
    return out


def global_dropout(x: torch.Tensor, p: float, dg, generator: torch.Generator | None,
                   training: bool = True, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Dropout whose mask does not depend on the partition, drawn on x's device for local rows only.

    One 62-bit seed is drawn from `generator` per call (every rank draws it, also a rank with no
    rows, so the generators stay in step; no communication), and the entry of (global row g,
    column c) is kept when `hash_uniform(g, c, seed) >= p`. P ranks therefore drop exactly the
    entries a 1-rank run drops and reproduce its training; the CPU and the GPU draw the same
    mask for the same seed. CPU: the uniforms of rows [lo, hi) in uint32 numpy
    (`hash_uniform_host`), no whole-graph tensor. CUDA float32: one fused kernel forward and
    backward (mgg/kernels/dropout.cu; no mask stored, no host traffic); other CUDA dtypes: the
    torch-op form.

    Args:
        x: float [n_local, D]. p: drop probability in [0, 1). generator: CPU generator (None:
        torch's default generator, which is only partition-independent if seeded identically).
        row_scale: None, or float [n_local] on x's device: each output row is also multiplied by
            it (in the same kernel on CUDA float32: a factor folded into the dropout, e.g. the
            gcn column factor of a following aggregate(factors=SCALED_INPUT)).
    Returns:
        float [n_local, D]: x * mask / (1 - p) (* row_scale[:, None]), or x (* row_scale[:, None])
        when not training or p == 0.
    """
    if row_scale is not None and (row_scale.dim() != 1 or row_scale.shape[0] != x.shape[0]):
        raise ValueError(f"global_dropout: row_scale must be [{x.shape[0]}], got {tuple(row_scale.shape)}")
    if not training or p <= 0.0:
        return x if row_scale is None else x * row_scale.to(x.dtype).unsqueeze(1)
    if p >= 1.0:
        return torch.zeros_like(x)
    return seeded_dropout(x, p, draw_seed(generator), int(dg.lo), row_scale)


def seeded_dropout(x: torch.Tensor, p: float, seed, row0: int,
                   row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`global_dropout`'s mask for a seed already drawn (`draw_seed`): x [n, D] whose row i is
    global row row0 + i, p in (0, 1) -> x * mask / (1 - p) (* row_scale[:, None]), differentiable.
    (mgg.nn.models.GNN draws its seeds itself, in global_dropout's order, and hands the next
    layer's to the hidden conv's Epilogue: mgg.nn.epilogue.)"""
    if x.is_cuda and x.dtype == torch.float32 and x.dim() == 2:
        return HashDropoutCUDA.apply(x, float(p), seed, int(row0), row_scale)
    if isinstance(seed, torch.Tensor):
        raise TypeError(f"global_dropout: seeds on the device (DeviceSeeds) need float32 [n, D] CUDA rows, "
                        f"got {x.dtype} {tuple(x.shape)} on {x.device}")
    if x.device.type == "cpu" and x.dim() == 2 and (row_scale is None or not row_scale.requires_grad):
        from .dropout_host import HashDropoutHost

        return HashDropoutHost.apply(x, float(p), int(seed), int(row0), row_scale)  # nothing kept for the backward
    if x.device.type == "cpu":
        keep = hash_uniform_host(row0, x.shape[0], x.shape[1], seed) >= p
        out = x * keep.to(x.dtype) / (1.0 - p)
    else:
        out = hash_dropout_reference(x, p, seed, row0)
    return out if row_scale is None else out * row_scale.to(out.dtype).unsqueeze(1)
