"""Which node order a run uses: ``--reorder-nodes auto`` (the default of mgg.prepare and mgg.train).

mgg gives each rank a contiguous range of node ids, so an order without locality makes every
rank read most of the graph from the others (products-like at P = 4: 72% of the nodes per
rank). The rule, measured on the generated presets (docs/partition.md):

1. A graph below `AUTO_MIN_NODES` nodes keeps its order (its halo is small whatever the order).
2. An order that is already local keeps it: the share of CSR entries whose source lies outside
   the target's range, over mgg's 8 ranges (estimated from `SAMPLES` evenly spaced entries), is
   at most `LOCAL_SHARE` of what a random order gives (7/8).
3. Otherwise the candidate order (`AUTO_CANDIDATE`, the cluster order) is computed, and kept
   only when it reads at most `MIN_GAIN` times the distinct remote rows of the input order
   (largest rank, summed over P = 2, 4, 8): on a graph where every rank reads nearly every node
   anyway (reddit-like), no order helps and the input order stays.

The decision reads the graph only, never the number of ranks or the device, so P ranks use the
order one rank uses (training on P ranks reproduces the 1-rank run), and every rank of a job
decides alike. Both outcomes are reported in one line (`OrderChoice.line`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

__all__ = ["AUTO_MIN_NODES", "LOCAL_SHARE", "MIN_GAIN", "PROBE_PARTS", "SAMPLES", "OrderChoice",
           "remote_share", "remote_rows_max", "input_order_is_local", "choose_order", "apply_order", "check_metis_fits", "AUTO_CANDIDATE"]

AUTO_MIN_NODES = 65_536
LOCAL_SHARE = 0.5
MIN_GAIN = 0.9
PROBE_PARTS = (2, 4, 8)
SAMPLES = 1 << 20
#: remote_share reads its samples as this many runs of consecutive entries, spread evenly: a
#: memory-mapped `indices` is then read at a few thousand pages, not at every page of the file
SAMPLE_RUNS = 4096
_SHARE_PARTS = 8
#: the order ``auto`` tries: label propagation communities. On products-like@1, papers-like@0.01
#: and reddit-like@0.25 its ranges read 0.92-1.10x the distinct remote rows of METIS's own P-way
#: partition at P = 2, 4, 8 (docs/partition.md), with a third to a tenth of METIS's memory,
#: in seconds on a GPU, with no extra package and the same labels on every device.
AUTO_CANDIDATE = "cluster"


@dataclass
class OrderChoice:
    """What ``auto`` (or an explicit method) decided, for the one-line report."""

    method: str                 # the order the graph is in now: "none" or a mgg.data.reorder method
    reason: str                 # why, in words
    share: float | None = None  # sampled remote-entry share of the input order (8 ranges)
    native_rows: int | None = None     # sum over PROBE_PARTS of the largest rank's remote rows, input order
    reordered_rows: int | None = None  # the same for the candidate order
    seconds: float = 0.0        # time spent relabelling and measuring

    @property
    def line(self) -> str:
        rows = ""
        if self.native_rows is not None and self.reordered_rows is not None:
            rows = (f"; remote rows of the largest rank, summed over P = 2, 4, 8: {self.native_rows:,} input "
                    f"order, {self.reordered_rows:,} reordered")
        return f"node order: {self.method} ({self.reason}{rows}; {self.seconds:.1f} s)"


def remote_share(indptr: np.ndarray, indices, parts: int = _SHARE_PARTS, samples: int = SAMPLES) -> float:
    """Estimated share of CSR entries whose source lies outside its target's range when mgg cuts
    `parts` ranges (`partition_ranges`): `samples` entries of `indices` in SAMPLE_RUNS evenly
    spaced runs of consecutive entries (a memory map is read only there; every entry when
    `samples` covers them). 0.0 for an edgeless graph."""
    from ..runtime.partition import owner_of, partition_ranges

    indptr = np.asarray(indptr, dtype=np.int64)
    e = int(indptr[-1])
    if e == 0:
        return 0.0
    bounds = partition_ranges(indptr, parts)
    if samples >= e:
        pos = np.arange(e, dtype=np.int64)
    else:
        runs = min(SAMPLE_RUNS, samples)
        run = samples // runs
        starts = np.linspace(0, e - run, num=runs).astype(np.int64)
        pos = np.unique((starts[:, None] + np.arange(run, dtype=np.int64)[None, :]).reshape(-1))
    src = np.asarray(indices[pos], dtype=np.int64)
    tgt = np.searchsorted(indptr, pos, side="right") - 1
    return float(np.mean(owner_of(src, bounds) != owner_of(tgt, bounds)))


def remote_rows_max(indptr: np.ndarray, indices, parts=PROBE_PARTS) -> dict[int, int]:
    """{P: distinct remote rows of the largest-halo rank} under mgg's ranges, for each P."""
    from ..runtime.footprint import footprints_from_chunks, array_chunks

    indptr = np.asarray(indptr, dtype=np.int64)
    fps = footprints_from_chunks(indptr, array_chunks(indices, int(indptr[-1])), list(parts))
    return {p: max(f.remote_rows for f in fps[p]) for p in parts}


def _size(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def check_metis_fits(num_nodes: int, num_edges: int, processes: int = 1, available: int | None = None) -> None:
    """ValueError (one line) when `processes` METIS runs on this host would not fit its free memory."""
    from ..data.metis_order import metis_host_bytes
    from .memory_check import host_available

    need = processes * metis_host_bytes(num_nodes, num_edges)
    free = host_available() if available is None else available
    if need > free:
        each = f" ({processes} ranks on this host, each runs it)" if processes > 1 else ""
        raise ValueError(f"--reorder-nodes metis: METIS needs about {_size(need)} for {num_nodes:,} nodes and "
                         f"{num_edges:,} edges{each}, this host has {_size(free)} free; use --reorder-nodes "
                         f"cluster (on a GPU: seconds), or python -m mgg.prepare on a larger host")


def apply_order(graph, method: str, device="cpu", processes: int = 1):
    """(graph relabelled by `method`, OrderChoice); ``method="none"`` returns `graph` itself.
    `processes`: how many processes of this host relabel at once (for METIS's memory check)."""
    from ..data.reorder import reorder_nodes

    t0 = time.perf_counter()
    if method == "none":
        return graph, OrderChoice("none", "--reorder-nodes none: the input order")
    if method == "metis":
        check_metis_fits(graph.num_nodes, graph.num_edges, processes)
    g, _ = reorder_nodes(graph, method, device=device)
    return g, OrderChoice(method, f"--reorder-nodes {method}", seconds=time.perf_counter() - t0)


def input_order_is_local(graph) -> tuple[bool, float | None, str]:
    """Rules 1 and 2: (keep the input order without trying another, the sampled remote share or
    None when not measured, why in words)."""
    n = graph.num_nodes
    if n < AUTO_MIN_NODES:
        return True, None, f"auto: {n:,} nodes, below {AUTO_MIN_NODES:,}: the input order"
    share = remote_share(graph.indptr, graph.indices)
    random_share = 1.0 - 1.0 / _SHARE_PARTS
    if share <= LOCAL_SHARE * random_share:
        return True, share, (f"auto: the input order is local ({share:.0%} of the edges cross 8 ranges, a random "
                             f"order {random_share:.0%})")
    return False, share, f"auto: {share:.0%} of the input order's edges cross 8 ranges"


def choose_order(graph, candidate: str = AUTO_CANDIDATE, device="cpu"):
    """``auto``: (graph in the order the module's rule picks, OrderChoice). `candidate`: the
    mgg.data.reorder method tried on a graph without locality; `device`: where it runs (the
    cluster order is the same on every device)."""
    from ..data.reorder import reorder_nodes

    t0 = time.perf_counter()
    local, share, why = input_order_is_local(graph)
    if local:
        return graph, OrderChoice("none", why, share=share, seconds=time.perf_counter() - t0)
    new, _ = reorder_nodes(graph, candidate, device=device)
    before = sum(remote_rows_max(graph.indptr, graph.indices).values())
    after = sum(remote_rows_max(new.indptr, new.indices).values())
    dt = time.perf_counter() - t0
    if after <= MIN_GAIN * before:
        return new, OrderChoice(candidate, why, share=share, native_rows=before, reordered_rows=after, seconds=dt)
    return graph, OrderChoice("none", f"auto: {candidate} order tried, it does not cut the remote rows by "
                                      f"{1 - MIN_GAIN:.0%}: the input order", share=share, native_rows=before,
                              reordered_rows=after, seconds=dt)
