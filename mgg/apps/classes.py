"""The number of classes a run trains: `--num-classes`, or what the labels imply, range-checked
on every rank before anything is built (mgg.data.labels has the rule).

Each rank summarises an equal share of the rows of `y` (a memory-mapped `y` is read only there),
the summaries are gathered, and every rank decides alike: the same number, or the same UserError
naming `y` and the row.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..data.labels import LabelShare, num_classes_of, share_bounds, summarize_share
from .config import TrainConfig, UserError

__all__ = ["label_share", "agree_num_classes", "resolve_num_classes", "with_num_classes"]


def label_share(graph: Any, rank: int, size: int, limit: int | None) -> LabelShare | None:
    """This rank's summary of `graph.y` (None: the graph has no labels; preparing it says so)."""
    from ..data.rows import read_rows

    y = getattr(graph, "y", None)
    if y is None:
        return None
    lo, hi = share_bounds(int(len(y)), rank, size)
    return summarize_share(y[lo:hi] if hasattr(y, "detach") else read_rows(y, lo, hi), lo, limit)


def agree_num_classes(share: LabelShare | None, cfg: TrainConfig, comm) -> int | None:
    """The number of classes every rank trains (None without labels). Collective (one
    allgather); a refused label raises the same UserError on every rank."""
    shares = comm.allgather(share)
    if any(s is None for s in shares):
        return None
    try:
        return num_classes_of(shares, cfg.num_classes)
    except ValueError as e:
        raise UserError(f"dataset {cfg.dataset!r}: {e}") from e


def resolve_num_classes(cfg: TrainConfig, comm, graph: Any) -> int | None:
    """`label_share` then `agree_num_classes` (collective), for a graph loaded without `load`."""
    return agree_num_classes(label_share(graph, comm.rank, comm.size, cfg.num_classes), cfg, comm)


def with_num_classes(prep: Any, classes: int | None) -> Any:
    """`prep` (a PreparedGraph or DeferredPrepared) training `classes` classes (unchanged: None)."""
    return prep if classes is None else dataclasses.replace(prep, num_classes=int(classes))
