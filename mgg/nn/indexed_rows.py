"""IndexedRows: a layer input whose row j is table[index[j]], read where it is used.

A sampled batch's input features are the rows n_id of the feature table. Gathering them first
writes a [U, F] copy that the first layer reads once more; when the table lies on the device in
one piece (one rank), the first layer's aggregation can read the table through the index instead
(mgg.nn.block_sum: one kernel, each sampled row read from the table), and only its root rows
x[:n_dst] are gathered. A value, not a flag: a layer that cannot read through an index
(`GraphConv.takes_indexed_rows` False) gets `materialize()`.

    rows = IndexedRows(table, n_id)       # table float [N, F], n_id int64 [U]
    rows.shape == (U, F); rows.materialize() == table[n_id]; rows.head(k) == IndexedRows(table, n_id[:k])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["IndexedRows", "materialize", "head_rows"]


@dataclass(frozen=True)
class IndexedRows:
    """Rows table[index] of a table, not copied.

    Attributes:
        table: float [N, F], no gradient (an input).
        index: int64 [U] row ids < N, on the table's device (not range-checked here: the caller's
            ids, as a sampler's).
    """

    table: torch.Tensor
    index: torch.Tensor

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
        return IndexedRows(self.table, self.index[:n])

    def materialize(self) -> torch.Tensor:
        """float [U, F]: table[index] (one row gather)."""
        return self.table.index_select(0, self.index)


def materialize(x) -> torch.Tensor:
    """x itself for a tensor, its rows for IndexedRows."""
    return x.materialize() if isinstance(x, IndexedRows) else x


def head_rows(x, n: int) -> torch.Tensor:
    """x[:n] as a tensor (for IndexedRows: a gather of those n rows only)."""
    return x.head(n).materialize() if isinstance(x, IndexedRows) else x[:n]
