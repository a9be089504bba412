"""The embedding-lookup service: HTTP on rank 0, bounded batched steps over all ranks.

Every rank loads its rows of every table into one `MultiTableEmbeddingBag`. Rank 0 runs the HTTP
front (`http_front`: aiohttp on its own event-loop thread; parses and validates each request,
4xx on anything wrong, and queues it) and, on its main thread, the batcher (`batcher`: turns the
queue into collective lookup steps of bounded work, with a heartbeat step when idle). The other
ranks join every step. Each step is armed with the watchdog on every rank: a stuck or dead rank
turns `/v1/health` to failing within `watchdog_timeout_s / 3` and ends the job (MPI_Abort, with
the watchdog's message) after `watchdog_timeout_s`.

STOP (from `POST /v1/shutdown` or SIGTERM/SIGINT on rank 0): every rank leaves its loop, frees the
store and returns 0.
"""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass

from ..knobs import SERVICE_DEFAULTS as _DEFAULTS
from ..runtime.comm import Communicator
from .bag import MultiTableEmbeddingBag
from .batcher import LookupBatcher
from .http_front import HttpFront, is_loopback
from .io import open_table
from .lookup_request import BadRequest, RequestLimits
from .service_metrics import ServiceMetrics
from .table import TableConfig

__all__ = ["ServiceConfig", "EmbeddingService", "is_loopback", "BadRequest"]


@dataclass
class ServiceConfig:
    """Every knob of the service (the `mgg.serve` flags of the same names set them).

    Per request: `max_body_bytes` (413 above), `max_bags` and `max_reply_bytes` (413 above:
    `bags x embedding_dim` floats in the reply's format), `request_timeout_s` (504).
    Batching: up to `max_batch` requests within `max_wait_ms` of the first; lookup passes of at
    most `max_batch_ids` ids + bags (a larger request is looked up in parts of that size, between
    the others' passes).
    Connections: `max_connections` open (the oldest idle one makes room), closed after
    `idle_timeout_s` without a complete request; `io_timeout_s` to read a body or write an answer.
    Ranks: `watchdog_timeout_s` a step may take before the job is aborted (0: no watchdog; health
    still turns failing after 10 s). The defaults are mgg.knobs.SERVICE_DEFAULTS.
    """

    host: str = _DEFAULTS["host"]
    port: int = _DEFAULTS["port"]
    token: str | None = None
    max_body_bytes: int = _DEFAULTS["max_body_bytes"]
    max_bags: int = _DEFAULTS["max_bags"]
    max_reply_bytes: int = _DEFAULTS["max_reply_bytes"]
    max_batch: int = _DEFAULTS["max_batch"]
    max_wait_ms: float = _DEFAULTS["max_wait_ms"]
    max_batch_ids: int = _DEFAULTS["max_batch_ids"]
    request_timeout_s: float = _DEFAULTS["request_timeout_s"]
    max_connections: int = _DEFAULTS["max_connections"]
    idle_timeout_s: float = _DEFAULTS["idle_timeout_s"]
    io_timeout_s: float = _DEFAULTS["io_timeout_s"]
    watchdog_timeout_s: float = _DEFAULTS["watchdog_timeout_s"]
    snapshot_dir: str = "snapshots"

    @property
    def heartbeat_s(self) -> float:
        """Idle rank 0 runs a SYNC step this often (well inside the watchdog timeout)."""
        return min(1.0, self.watchdog_timeout_s / 10) if self.watchdog_timeout_s > 0 else 1.0

    @property
    def stalled_after_s(self) -> float:
        """Health turns failing when no step has completed for this long."""
        return self.watchdog_timeout_s / 3 if self.watchdog_timeout_s > 0 else 10.0


class EmbeddingService:
    """Collective: every rank constructs it (loading its rows of every table), calls `bind()`
    and `run()`."""

    def __init__(self, specs: list[TableConfig], comm: Communicator, cfg: ServiceConfig, store=None):
        self.comm, self.cfg, self.specs = comm, cfg, specs
        self.names = {s.name: i for i, s in enumerate(specs)}
        err, arrays, shapes = None, [], []
        try:
            for s in specs:
                arrays.append(open_table(s))
                shapes.append(tuple(arrays[-1].shape))
        except Exception as e:  # noqa: BLE001 - agreed below
            err = e
        comm.check(err)
        if len(set(map(tuple, comm.allgather(shapes)))) != 1:
            raise ValueError("table files differ between ranks")
        tables = [s.with_shape(n, d) for s, (n, d) in zip(specs, shapes)]
        self.bag = MultiTableEmbeddingBag(tables, comm, store, include_last_offset=True, weights=arrays)
        self.bag.eval()
        del arrays
        self.limits = RequestLimits(cfg.max_body_bytes, cfg.max_bags, cfg.max_reply_bytes)
        self.metrics = ServiceMetrics()
        self.stop_event = threading.Event()
        self.batcher = LookupBatcher(self.bag, specs, comm, self.metrics, max_batch=cfg.max_batch,
                                     max_wait_ms=cfg.max_wait_ms, max_batch_ids=cfg.max_batch_ids,
                                     heartbeat_s=cfg.heartbeat_s)
        self.front = None
        self._address: tuple[str, int] | None = None

    # -- binding (rank 0), agreed with the other ranks ---------------------------------------------
    def bind(self) -> None:
        err = None
        if self.comm.rank == 0:
            self.front = HttpFront(self)
            try:
                self._address = self.front.bind()
            except OSError as e:
                err = e
        self.comm.check(err)

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    # -- state for the front -----------------------------------------------------------------------
    def ranks_problem(self) -> str | None:
        """Why the ranks look stuck (no step completed for `stalled_after_s`), or None."""
        stalled = self.batcher.stalled_s()
        if stalled <= self.cfg.stalled_after_s:
            return None
        end = (f"; the watchdog ends the service after {self.cfg.watchdog_timeout_s:g} s"
               if self.cfg.watchdog_timeout_s > 0 else "")
        return (f"ranks not responding: no collective step completed for {stalled:.1f} s "
                f"(a rank is stuck or dead){end}")

    def health(self) -> dict:
        problem = self.ranks_problem()
        h = {"status": "failing" if problem else "ok", "world_size": self.comm.size, "pid": os.getpid(),
             "tables": self.tables_info(),
             "ranks": {"last_step_s_ago": round(self.batcher.stalled_s(), 3),
                       "failing_after_s": self.cfg.stalled_after_s,
                       "watchdog_timeout_s": self.cfg.watchdog_timeout_s}}
        if problem:
            h["reason"] = problem
        return h

    def tables_info(self) -> dict:
        return {c.name: {"num_embeddings": c.num_embeddings, "embedding_dim": c.embedding_dim, "mode": c.mode,
                         "sharding": c.sharding} for c in self.bag.tables}

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        if self.cfg.watchdog_timeout_s > 0 and self.comm.size > 1:
            self.comm.start_watchdog(self.cfg.watchdog_timeout_s)
        try:
            if self.comm.rank == 0:
                self._run_root()
            else:
                self.batcher.run_worker()
        finally:
            if self.comm.watchdog is not None:
                self.comm.watchdog.close()
                self.comm.watchdog = None
            self.bag.free()
        return 0

    def _run_root(self) -> None:
        def on_signal(signum, frame):  # noqa: ARG001
            self.stop_event.set()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.front.start()
        try:
            self.batcher.run_root(self.stop_event)
        finally:
            self.stop_event.set()
            self.batcher.finish()
            self.front.stop()
            for s, h in old.items():
                signal.signal(s, h)
