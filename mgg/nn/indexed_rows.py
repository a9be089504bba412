"""IndexedRows: a layer input whose row j is table[index[j]], read where it is used.

A sampled batch's input features are the rows n_id of the feature table. Gathering them first
writes a [U, F] copy that the first layer reads once more; when the table lies on the device in
one piece (one rank), the first layer's aggregation can read the table through the index instead
(mgg.nn.block_sum: one kernel, each sampled row read from the table), and only its root rows
x[:n_dst] are gathered. A value, not a flag: a layer that cannot read through an index
(`GraphConv.takes_indexed_rows` False) gets `materialize()`.

    rows = IndexedRows(table, n_id)       # table float [N, F], n_id int64 [U]
    rows.shape == (U, F); rows.materialize() == table[n_id]; rows.head(k) == IndexedRows(table, n_id[:k])

On the GPU the table may also be given by its address in device memory (`address`, int64 [1];
`table` is then an empty [0, F] tensor of its dtype and device): a step replayed from a CUDA graph
reads each batch's rows where they are, and only the address changes between replays. Such rows
are read by the block_sum kernel (also to materialise them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["IndexedRows", "materialize", "head_rows"]


@dataclass(frozen=True)
class IndexedRows:
    """Rows table[index] of a table, not copied.

    Attributes:
        table: float [N, F], no gradient (an input); with `address`, float32 [0, F] on the GPU.
        index: int64 [U] row ids < N, on the table's device (not range-checked here: the caller's
            ids, as a sampler's).
        address: None, or int64 [1] on the table's GPU holding the address of the float32 [N, F]
            table (contiguous, 16-byte aligned), read when a kernel runs.
    """

    table: torch.Tensor
    index: torch.Tensor
    address: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.table.dim() != 2:
            raise ValueError(f"IndexedRows: table must be [N, F], got shape {tuple(self.table.shape)}")
        if self.index.dim() != 1 or self.index.dtype != torch.int64:
            raise TypeError(f"IndexedRows: index must be a 1-D int64 tensor, got {self.index.dtype} "
                            f"{tuple(self.index.shape)}")
        if self.index.device != self.table.device:
            raise ValueError(f"IndexedRows: index on {self.index.device}, table on {self.table.device}")
        if self.table.requires_grad:
            raise ValueError("IndexedRows: the table is an input; it takes no gradient")
        if self.address is not None and not (self.table.is_cuda and self.table.dtype == torch.float32
                                             and self.address.dtype == torch.int64
                                             and self.address.device == self.table.device
                                             and self.address.numel() == 1):
            raise ValueError("IndexedRows: a table given by its address is float32 on a GPU, the address "
                             "one int64 on that GPU")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((int(self.index.numel()), int(self.table.shape[1])))

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def device(self) -> torch.device:
        return self.table.device

    @property
    def is_cuda(self) -> bool:
        return self.table.is_cuda

    def dim(self) -> int:
        return 2

    def head(self, n: int) -> "IndexedRows":
        """The first n rows, still indexed."""
        return IndexedRows(self.table, self.index[:n], self.address)

    def materialize(self) -> torch.Tensor:
        """float [U, F]: table[index] (one row gather)."""
        if self.address is None:
            return self.table.index_select(0, self.index)
        from ..kernels.block_sum import block_sum_cuda

        n = int(self.index.numel())
        one_each = torch.arange(n + 1, device=self.index.device)  # row i sums its one row index[i]
        return block_sum_cuda(self.table, one_each, one_each[:n], n, src_index=self.index, x_addr=self.address)


def materialize(x) -> torch.Tensor:
    """x itself for a tensor, its rows for IndexedRows."""
    return x.materialize() if isinstance(x, IndexedRows) else x


def head_rows(x, n: int) -> torch.Tensor:
    """x[:n] as a tensor (for IndexedRows: a gather of those n rows only)."""
    return x.head(n).materialize() if isinstance(x, IndexedRows) else x[:n]
