"""The aggregation of the sampled block convolutions: a block's row sums with scales and dropout.

    block_sum(x, block, src_scale, dst_scale, drop)[i] = dst_scale[i] * sum_{k in ptr[i]:ptr[i+1]}
                                                          src_scale[col[k]] * drop(x)[col[k]]

A diagonal scale is a value (None: 1): SAGE's mean is dst_scale = 1 / deg, GCN's normalisation
its two degree factors. `drop` (a `BlockDropout`) is the dropout the layer applies to its input
rows before the convolution, folded into the aggregation: on the GPU (float32) one kernel reads
each sampled row of x once and writes the [n_dst, F] sums (mgg/kernels/block_sum.cu), so neither
the dropped copy of x nor the [E, F] messages of an index_select + index_add exist; its backward
is the transposed kernel, the mask regenerated from the seed. Elsewhere the same sums in torch
ops. Both draw the mask of `seeded_dropout(x, p, seed, 0)`: rows are numbered by their position
in x, so a layer drops its root rows x[:n_dst] with `drop.apply(x[:n_dst])` and gets the same
entries the aggregation dropped.

x may be `IndexedRows` (mgg.nn.indexed_rows): on the GPU the kernel reads each sampled row from
the table through the index (no gathered copy); elsewhere the rows are gathered first.

The block is duck-typed (`ptr`, `col`, `row`, `n_src`, `n_dst`, e.g. mgg.sample.Block).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .functional import draw_seed, seeded_dropout
from .indexed_rows import IndexedRows

__all__ = ["BlockDropout", "BlockSum", "block_sum"]


@dataclass(frozen=True)
class BlockDropout:
    """The dropout of a layer's input rows, x[j, c] kept when hash_uniform(j, c, seed) >= p and
    scaled by 1 / (1 - p), rows j numbered from 0 in x.

    Attributes:
        p: drop probability in (0, 1).
        seed: a 62-bit int, or an int64 CUDA tensor (a device-side seed: no host synchronisation
            to draw it; mgg.nn.functional.draw_seed).
    """

    p: float
    seed: int | torch.Tensor

    @classmethod
    def draw(cls, p: float, generator) -> "BlockDropout":
        """One seed from `generator` (a torch.Generator, on the CPU or a GPU, a DeviceSeeds, or
        None for torch's default generator)."""
        return cls(float(p), draw_seed(generator))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x with this dropout applied, x's rows numbered from 0 (differentiable)."""
        return seeded_dropout(x, self.p, self.seed, 0)


class BlockSum(torch.autograd.Function):
    """`block_sum` of float32 CUDA rows by mgg/kernels/block_sum.cu; only the block, the scales
    and the seed are kept for the backward (no activation)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor, n_dst: int,  # type: ignore[override]
                src_scale: torch.Tensor | None, dst_scale: torch.Tensor | None, p: float, seed,
                src_index: torch.Tensor | None = None, x_addr: torch.Tensor | None = None) -> torch.Tensor:
        from ..kernels.block_sum import block_sum_cuda

        if src_index is not None and x.requires_grad:
            raise ValueError("block_sum: a table read through an index takes no gradient")
        ctx.block = (ptr, col, int(x.shape[0]))
        ctx.scales, ctx.drop = (src_scale, dst_scale), (p, seed)
        return block_sum_cuda(x.detach(), ptr, col, n_dst, src_scale, dst_scale, p, seed, src_index, x_addr)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        from ..kernels.block_sum import block_sum_grad_cuda

        grad_x = None
        if ctx.needs_input_grad[0]:
            ptr, col, n_src = ctx.block
            grad_x = block_sum_grad_cuda(grad_out, ptr, col, n_src, *ctx.scales, *ctx.drop)
        return grad_x, None, None, None, None, None, None, None, None, None


def block_sum(x: torch.Tensor | IndexedRows, block, src_scale: torch.Tensor | None = None,
              dst_scale: torch.Tensor | None = None, drop: BlockDropout | None = None) -> torch.Tensor:
    """float [n_src, F] -> [n_dst, F]: the block's scaled sums of (dropped) rows (module doc).

    Args:
        x: float [block.n_src, F], or IndexedRows of n_src rows. src_scale: float [n_src] or
            None. dst_scale: float [n_dst] or None (constants: no gradient flows into them).
            drop: the input dropout, or None.
    Raises:
        ValueError when x's rows are not the block's src nodes.
    """
    if x.shape[0] != block.n_src:
        raise ValueError(f"block_sum: x has {x.shape[0]} rows, the block has {block.n_src} src nodes")
    if x.is_cuda and x.dtype == torch.float32 and x.dim() == 2:
        p, seed = (drop.p, drop.seed) if drop is not None else (0.0, None)
        table, index, addr = (x.table, x.index, x.address) if isinstance(x, IndexedRows) else (x, None, None)
        return BlockSum.apply(table, block.ptr, block.col, int(block.n_dst), src_scale, dst_scale, p, seed, index,
                              addr)
    if isinstance(x, IndexedRows):
        x = x.materialize()
    h = drop.apply(x) if drop is not None else x
    if src_scale is not None:
        h = h * src_scale.detach().to(h.dtype).unsqueeze(1)
    out = h.new_zeros((block.n_dst,) + tuple(h.shape[1:]))
    col, row = block.col, None
    if col.numel() and col.device.type == "cpu" and int(block.ptr[-1]) < col.numel():
        # a padded block (mgg.apps.sampled_graphed): edges past ptr[-1] belong to no dst row
        col = col[: int(block.ptr[-1])]
        row = torch.repeat_interleave(torch.arange(block.n_dst), block.deg, output_size=col.numel())
    if col.numel():
        out = out.index_add(0, block.row if row is None else row, h.index_select(0, col))
    if dst_scale is not None:
        out = out * dst_scale.detach().to(out.dtype).unsqueeze(1)
    return out
