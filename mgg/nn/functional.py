"""Differentiable distributed aggregation and a partition-independent dropout.

Both functions take a `DistGraph` (mgg.runtime) and work on this rank's rows only: tensors are
float32 [n_local, D] on `dg.device`. Every rank must call them in the same order (they are
collective, and so is the backward of `aggregate`).
"""
from __future__ import annotations

import torch

__all__ = ["Aggregate", "aggregate", "global_dropout", "hash_uniform"]


class Aggregate(torch.autograd.Function):
    """out = W x (+ diag * x) over the distributed graph; backward: grad_x = W^T grad_out (+ diag).

    The forward runs the plan of `kind`, the backward the transposed plan (reverse graph), both
    collectives: autograd visits the Aggregate nodes of identical graphs in the same order on
    every rank, so the backward exchanges match up.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dg, kind: str) -> torch.Tensor:  # type: ignore[override]
        ctx.dg = dg
        ctx.kind = kind
        return dg.aggregate(x.detach().contiguous(), kind)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_x = ctx.dg.aggregate(grad_out.contiguous(), ctx.kind, transposed=True)
        return grad_x, None, None


def aggregate(x: torch.Tensor, dg, kind: str) -> torch.Tensor:
    """Differentiable `dg.aggregate(x, kind)`.

    Args:
        x: float [n_local, D], this rank's node rows.
        dg: the DistGraph.
        kind: "sum" | "mean" | "gcn" (see docs/architecture.md).
    Returns:
        float [n_local, D].
    """
    return Aggregate.apply(x, dg, kind)


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


def global_dropout(x: torch.Tensor, p: float, dg, generator: torch.Generator | None,
                   training: bool = True) -> torch.Tensor:
    """Dropout whose mask does not depend on the partition, drawn on x's device.

    On the CPU the keep-mask is drawn for the whole graph from `generator` (every rank seeds it
    identically) and rows [lo, hi) are used. On the GPU one 63-bit seed is drawn from `generator`
    per call and the entry of (global row g, column c) is `hash_uniform(g, c, seed) >= p`.
    P ranks therefore drop exactly the entries a 1-rank run drops and reproduce its training, and
    the mask is computed where x lives (no [num_nodes, D] host tensor, no transfer).

    Args:
        x: float [n_local, D]. p: drop probability in [0, 1). generator: CPU generator (None:
        torch's default generator, which is only partition-independent if seeded identically).
    Returns:
        float [n_local, D]: x * mask / (1 - p), or x when not training or p == 0.
    """
    if not training or p <= 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    if x.device.type == "cpu":
        # host tensors: the whole-graph mask drawn from the generator, rows [lo, hi) kept
        u = torch.rand((dg.num_nodes, x.shape[1]), generator=generator)
        keep = dg.local(u) >= p
        return x * keep.to(x.dtype) / (1.0 - p)
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator).item())
    out = torch.empty_like(x)
    rows_per_chunk = max(1, (1 << 22) // max(1, x.shape[1]))  # bounded int64 temporaries
    for a in range(0, x.shape[0], rows_per_chunk):
        b = min(x.shape[0], a + rows_per_chunk)
        rows = torch.arange(dg.lo + a, dg.lo + b, device=x.device, dtype=torch.int64)
        keep = hash_uniform(rows, x.shape[1], seed) >= p
        out[a:b] = x[a:b] * keep.to(x.dtype) / (1.0 - p)
    return out
