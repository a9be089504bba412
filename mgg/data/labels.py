"""How many classes the labels imply, and the labels training must refuse.

Labels `y` (int64 [N]) are class ids 0..C-1, and -1 for an unlabelled node. C is `--num-classes`
when given (a label >= C is refused), else max(y) + 1 -- unless that leaves more than
max(EMPTY_CLASSES_ALLOWED, D) of the classes 0..max(y) without a single node, D being the number
of distinct labels: one stray label of 100000 in a 7-class graph would otherwise make a
100,001-class model (a last layer and logits 14,000x wider; a label of 10^9, an allocation that
cannot succeed). Such labels are refused, naming the row; `--num-classes` says that many classes
are meant.

The check runs on shares of rows so that no rank reads all of a memory-mapped `y`: each rank
summarises its share (`summarize_share`), the summaries are gathered, and `num_classes_of` decides
the same on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LabelShare", "summarize_share", "num_classes_of", "share_bounds", "EMPTY_CLASSES_ALLOWED",
           "DISTINCT_CAP"]

#: classes 0..max(y) that may have no node at all without --num-classes (besides up to D of them)
EMPTY_CLASSES_ALLOWED = 16
#: a share with more distinct labels than this is not summarised by them (the implied count is used)
DISTINCT_CAP = 4096
#: labels are counted with a bincount below this bound, sorted above it
_BINCOUNT_MAX = 1 << 20


@dataclass(frozen=True)
class LabelShare:
    """What one share of rows [lo, lo + rows) says about the labels (ints; rows are global)."""

    rows: int
    below_row: int = -1       # first row with y < -1 (-1: none)
    below_value: int = 0
    max_value: int = -1       # largest label (-1: none labelled)
    max_row: int = -1         # its first row
    distinct: tuple[int, ...] | None = ()  # the labels >= 0 that occur; None: more than DISTINCT_CAP
    over_row: int = -1        # first row with y >= the limit given (-1: none, or no limit)
    over_value: int = 0


def share_bounds(n: int, rank: int, size: int) -> tuple[int, int]:
    """Rows [lo, hi) of share `rank` of `size` equal shares of n rows."""
    return n * rank // size, n * (rank + 1) // size


def summarize_share(y, lo: int, limit: int | None = None) -> LabelShare:
    """Summarise labels `y` (int array [rows] of the global rows lo, lo + 1, ...; a numpy array,
    a memory map or a torch tensor) against `limit` (--num-classes, or None)."""
    if hasattr(y, "detach"):  # a torch tensor (a generated graph drawn on a GPU)
        y = y.detach().cpu().numpy()
    y = np.asarray(y).reshape(-1)
    if len(y) == 0 or y.dtype.kind not in "iu":  # not integers: the validator names the dtype
        return LabelShare(len(y))
    below = np.flatnonzero(y < -1)
    b_row, b_val = (int(below[0]), int(y[below[0]])) if len(below) else (-1, 0)
    k = int(np.argmax(y))
    top = int(y[k])
    o_row, o_val = -1, 0
    if limit is not None and top >= limit:
        first = int(np.argmax(y >= limit))
        o_row, o_val = lo + first, int(y[first])
    distinct: tuple[int, ...] | None = ()
    if top >= 0:
        labelled = y[y >= 0]
        if top < _BINCOUNT_MAX:
            present = np.flatnonzero(np.bincount(labelled, minlength=0))
        else:
            present = np.unique(labelled)
        distinct = tuple(int(v) for v in present) if len(present) <= DISTINCT_CAP else None
    return LabelShare(len(y), lo + b_row if b_row >= 0 else -1, b_val, top, lo + k if top >= 0 else -1,
                      distinct, o_row, o_val)


def num_classes_of(shares: list[LabelShare], limit: int | None = None) -> int:
    """The number of classes the gathered `shares` (in row order) imply, given --num-classes
    `limit` (or None). ValueError, one line naming `y` and the row, for a label below -1, a
    label >= `limit`, or (without `limit`) a largest label that leaves too many classes empty."""
    bad = next((s for s in shares if s.below_row >= 0), None)
    if bad is not None:
        raise ValueError(f"y[{bad.below_row}]={bad.below_value} is below -1 (labels are class ids >= 0, "
                         f"-1 marks an unlabelled node)")
    top = max((s.max_value for s in shares), default=-1)
    if limit is not None:
        over = next((s for s in shares if s.over_row >= 0), None)
        if over is not None:
            raise ValueError(f"y[{over.over_row}]={over.over_value} is not below --num-classes {limit} "
                             f"(labels are 0..{limit - 1}, -1 for unlabelled)")
        return int(limit)
    if top < 0:
        return 1
    if any(s.distinct is None for s in shares):  # thousands of classes: not a stray label
        return top + 1
    present = sorted(set().union(*(s.distinct or () for s in shares)))
    d, implied = len(present), top + 1
    if implied - d > max(EMPTY_CLASSES_ALLOWED, d):
        row = next(s.max_row for s in shares if s.max_value == top)
        nxt = present[-2] if d > 1 else None
        others = f"the next largest is {nxt}" if nxt is not None else "no other label occurs"
        raise ValueError(f"y[{row}]={top} implies {implied} classes, but only {d} distinct labels occur "
                         f"({others}); fix the label, or give --num-classes {implied} to train "
                         f"{implied} classes")
    return implied
