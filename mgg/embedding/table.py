"""The one descriptor of an embedding table, for the training modules and the lookup service.

A table is a float array [num_embeddings, embedding_dim] pooled with `mode` and row-sharded with
`sharding` over the ranks (`mgg.embedding.sharding`). A table served from a file (tables.json)
also names the file (`path`, and `key` inside a safetensors file); its shape is unknown until the
file is opened, so `num_embeddings`/`embedding_dim` may be None there and `with_shape` fills them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .sharding import SHARDINGS
from .validate import MODES

__all__ = ["TableConfig", "DEFAULT_MODE"]

DEFAULT_MODE = "sum"  # the tables.json default; torch.nn.EmbeddingBag's "mean" stays ShardedEmbeddingBag's


@dataclass(frozen=True)
class TableConfig:
    """One table: cardinality N, width D, pooling mode, sharding, name; for a file-backed table the
    file (`path`, `.npy` or `.safetensors`) and the tensor name inside a safetensors file (`key`,
    default: its only tensor). N and D are None only for a file-backed table not opened yet."""

    num_embeddings: int | None
    embedding_dim: int | None
    mode: str = DEFAULT_MODE
    sharding: str = "range"
    name: str = ""
    path: str | None = None
    key: str | None = None

    def __post_init__(self):
        shape = (self.num_embeddings, self.embedding_dim)
        if shape == (None, None):
            if self.path is None:
                raise ValueError(f"table {self.name!r}: num_embeddings and embedding_dim are needed without a path")
        else:
            if self.num_embeddings is None or int(self.num_embeddings) < 1:
                raise ValueError(f"table {self.name!r}: num_embeddings must be >= 1, got {self.num_embeddings}")
            if self.embedding_dim is None or int(self.embedding_dim) < 1:
                raise ValueError(f"table {self.name!r}: embedding_dim must be >= 1, got {self.embedding_dim}")
        if self.mode not in MODES:
            raise ValueError(f"table {self.name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"table {self.name!r}: sharding must be one of {SHARDINGS}, got {self.sharding!r}")

    @property
    def has_shape(self) -> bool:
        """Whether N and D are known (always, except for a file-backed table not opened yet)."""
        return self.num_embeddings is not None

    def with_shape(self, num_embeddings: int, embedding_dim: int) -> TableConfig:
        """This table with N and D set (from the opened file)."""
        return replace(self, num_embeddings=int(num_embeddings), embedding_dim=int(embedding_dim))
