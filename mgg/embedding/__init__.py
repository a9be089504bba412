"""Sharded embedding bags over the symmetric store (DLRM-style lookups), their optimizers,
and the HTTP lookup service (`mgg.embedding.service`, client in `mgg.embedding.client`).

Layering: imports mgg.runtime and mgg.kernels only.
"""
from .bag import MultiTableEmbeddingBag, ShardedEmbeddingBag, SparseRowGrad
from .init import init_rows, init_table
from .optim import RowWiseAdagrad, SparseSGD
from .sharding import TableLayout
from .table import DEFAULT_MODE, TableConfig
from .validate import MODES, check_bag_input

__all__ = ["ShardedEmbeddingBag", "MultiTableEmbeddingBag", "TableConfig", "SparseRowGrad", "SparseSGD",
           "RowWiseAdagrad", "TableLayout", "init_rows", "init_table", "MODES", "DEFAULT_MODE",
           "check_bag_input"]
