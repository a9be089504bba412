"""What each rank's aggregation plans read, for the metrics JSON: per direction, the most and the
total over the ranks of the rows a rank owns, the local and remote entries of its plan and its
distinct remote (halo) rows -- the rows that cross NVLink (or the network) once per aggregation.
Collective."""
from __future__ import annotations

import numpy as np

__all__ = ["plan_summary", "PLAN_FIGURES"]

#: the figures of one plan (AggregationPlan.stats names)
PLAN_FIGURES = ("n_local", "local_edges", "remote_edges", "halo_rows")


def plan_summary(dg, kind: str | None) -> dict:
    """{"forward" | "transposed": {"<figure>_max": int, "<figure>_sum": int}} of the plans of
    aggregation `kind` (the whole-graph plans, not the row sets'); {} for a model without one
    (GAT). Collective over dg.comm."""
    if kind is None:
        return {}
    out = {}
    for name, transposed in (("forward", False), ("transposed", True)):
        st = dg.plan(kind, transposed).stats()
        mine = np.asarray([float(st[f]) for f in PLAN_FIGURES], dtype=np.float64)
        most = dg.comm.allreduce_(mine.copy(), "max")
        total = dg.comm.allreduce_(mine.copy(), "sum")
        out[name] = {**{f"{f}_max": int(v) for f, v in zip(PLAN_FIGURES, most)},
                     **{f"{f}_sum": int(v) for f, v in zip(PLAN_FIGURES, total)}}
    return out
