"""What the GPU lookup of an embedding module costs, counted where the work is issued.

`MultiTableEmbeddingBag.counters` adds up, over its forward calls on the GPU, every kernel launch
(its own kernels and the torch operations it issues: dtype conversions, sorts, torch's
embedding_bag), every host synchronisation, every host-device copy and every global barrier.
The rows its kernels read, and how many of them came from other PEs (over NVLink on one node),
are counted on the GPU in the tables' status records and read with `lookup_rows()`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["LookupCounters"]


@dataclass
class LookupCounters:
    """Totals over forward calls since the last `reset()`.

    Attributes:
        calls: forward calls.
        launches: kernel launches (including torch operations that launch one).
        host_syncs: times the host waited for the GPU.
        h2d_copies, d2h_copies: host-to-device and device-to-host copies.
        barriers: global barriers (NVSHMEM or MPI).
    """

    calls: int = 0
    launches: int = 0
    host_syncs: int = 0
    h2d_copies: int = 0
    d2h_copies: int = 0
    barriers: int = 0

    def reset(self) -> None:
        for k in asdict(self):
            setattr(self, k, 0)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)

    def per_call(self) -> dict[str, float]:
        """Each count divided by `calls` (NaN without calls)."""
        n = self.calls
        return {k: (v / n if n else float("nan")) for k, v in asdict(self).items() if k != "calls"}
