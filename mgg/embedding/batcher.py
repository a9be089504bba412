"""The service's batcher: rank 0 turns queued lookups into bounded collective steps; the other
ranks join every step.

Rank 0's main thread loops:

* takes the queued jobs (after the first of an idle spell it waits `max_wait_ms` for more, up to
  `max_batch` requests);
* plans one step of at most `max_batch_ids` work units (a unit is one id or one bag): first every
  pending request that fits whole, in arrival order, then a chunk of the oldest request that does
  not (at least half the budget, at least one bag), so a large request is looked up over several
  steps while small ones ride along in each and are never held behind it;
* runs the step: broadcasts the header (`Ibcast`), all ranks run one
  `MultiTableEmbeddingBag.forward` (rank 0's share is the whole step, the others serve their
  slices to its one-sided gets with an empty batch), then a barrier;
* when idle, a SYNC step (header + barrier) every `heartbeat_s`, so a dead or stopped rank shows
  within seconds even without traffic;
* snapshots between steps: rank 0 reads every table through the store, one SYNC step per
  64K-row chunk, writing each table to a temp file then `os.replace`;
* when `stop` is set (shutdown endpoint, SIGTERM/SIGINT), a STOP header: every rank leaves.

Every step is armed on every rank with the communicator's watchdog (`Communicator.guard`), and the
other ranks arm their wait for the next header too: a stuck or dead rank ends the job (MPI_Abort,
message on stderr) after the watchdog timeout instead of hanging. `stalled_s()` (seconds since a
step last completed) is what `/v1/health` reports.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from typing import Callable

import numpy as np
import torch

from ..runtime.comm import Communicator
from .bag import MultiTableEmbeddingBag
from .io import write_json_atomic, write_npy_atomic
from .lookup_request import BadRequest, LookupRequest
from .service_metrics import ServiceMetrics

__all__ = ["LookupJob", "ControlJob", "LookupBatcher", "OP_LOOKUP", "OP_SYNC", "OP_STOP", "CONTROL_SNAPSHOT"]

OP_LOOKUP, OP_SYNC, OP_STOP = 1, 2, 3  # step headers
CONTROL_SNAPSHOT = "snapshot"
SNAPSHOT_CHUNK_ROWS = 1 << 16


class LookupJob:
    """One lookup request in flight: its bags are looked up from `cursor` on, into `out`
    [B, D] float32; `on_done(job)` is called (from the batcher thread) once with `out` or `error`."""

    __slots__ = ("req", "cum", "cursor", "out", "error", "on_done", "cancelled")

    def __init__(self, req: LookupRequest, on_done: Callable[["LookupJob"], None]):
        self.req, self.on_done = req, on_done
        # cum[k] - cum[c]: work units (ids + bags) of bags [c, k)
        off = req.bag.offsets.numpy()
        self.cum = off + np.arange(off.size, dtype=np.int64)
        self.cursor = 0
        self.out: np.ndarray | None = None
        self.error: BadRequest | None = None
        self.cancelled = False  # the client is gone: skipped at the next plan

    @property
    def num_bags(self) -> int:
        return self.req.bag.num_bags

    def remaining_units(self) -> int:
        return int(self.cum[-1] - self.cum[self.cursor])

    def bags_within(self, units: int) -> int:
        """How many bags from `cursor` on fit in `units` (0 when not even one)."""
        end = int(np.searchsorted(self.cum, self.cum[self.cursor] + units, side="right")) - 1
        return max(0, min(end, self.num_bags) - self.cursor)


class ControlJob:
    """CONTROL_SNAPSHOT (arg: the folder); `on_done(job)` with `result` or `error`."""

    __slots__ = ("op", "arg", "result", "error", "on_done")

    def __init__(self, op: str, arg=None, on_done: Callable[["ControlJob"], None] | None = None):
        self.op, self.arg, self.on_done = op, arg, on_done or (lambda job: None)
        self.result = self.error = None


class LookupBatcher:
    """Collective: every rank makes one over the same `bag` and calls `run_root` (rank 0) or
    `run_worker` (the others)."""

    def __init__(self, bag: MultiTableEmbeddingBag, specs: list, comm: Communicator, metrics: ServiceMetrics, *,
                 max_batch: int, max_wait_ms: float, max_batch_ids: int, heartbeat_s: float):
        self.bag, self.specs, self.comm, self.metrics = bag, specs, comm, metrics
        self.max_batch, self.max_wait_s, self.max_batch_ids = max_batch, max_wait_ms / 1e3, max_batch_ids
        self.heartbeat_s = heartbeat_s
        self.queue: queue.Queue = queue.Queue()
        self.pending: list[LookupJob] = []
        self.last_step_end = time.monotonic()

    # -- state read by the HTTP front --------------------------------------------------------------
    def submit(self, job: LookupJob | ControlJob) -> None:
        self.queue.put(job)

    def stalled_s(self) -> float:
        """Seconds since a collective step last completed (steps run at least every heartbeat_s)."""
        return time.monotonic() - self.last_step_end

    # -- steps (all ranks) -------------------------------------------------------------------------
    def _header(self, op: int) -> None:
        if self.comm.size > 1:
            self.comm.comm.Ibcast(np.array([op, 0], dtype=np.int64), root=0).Wait()

    def _wait_header(self) -> int:
        """Ranks > 0: the next step's op (Ibcast polled with short sleeps: idle ranks do not spin)."""
        hdr = np.zeros(2, dtype=np.int64)
        req = self.comm.comm.Ibcast(hdr, root=0)
        while not req.Test():
            time.sleep(0.0002)
        return int(hdr[0])

    def _forward(self, idx, off, psw):
        with torch.no_grad():
            return self.bag(idx, off, psw)

    def sync_step(self, work: Callable[[], object] | None = None):
        """Rank 0: one SYNC step (header, `work()` on rank 0, barrier); returns work's result."""
        with self.comm.guard("serve: sync step"):
            self._header(OP_SYNC)
            try:
                return work() if work is not None else None
            finally:
                self.comm.barrier()
                self.last_step_end = time.monotonic()
                self.metrics.record_step(0, lookup=False)

    def run_worker(self) -> None:
        T = self.bag.num_tables
        while True:
            with self.comm.guard("serve: waiting for rank 0's next step"):
                op = self._wait_header()
            if op == OP_LOOKUP:
                with self.comm.guard("serve: lookup step"):
                    try:
                        self._forward([None] * T, [None] * T, [None] * T)
                    finally:
                        self.comm.barrier()
            elif op == OP_SYNC:
                self.comm.barrier()
            elif op == OP_STOP:
                return

    # -- rank 0 ------------------------------------------------------------------------------------
    def run_root(self, stop: threading.Event) -> None:
        """Serve until `stop` is set (by STOP, a signal or the front); the caller then calls `finish`."""
        self.last_step_end = time.monotonic()
        controls: list[ControlJob] = []
        while not stop.is_set():
            self._collect(controls)
            self.pending = [j for j in self.pending if not j.cancelled]
            if self.pending:
                self._lookup_step(self._plan())
            elif time.monotonic() - self.last_step_end >= self.heartbeat_s:
                self.sync_step()
            while controls and not stop.is_set():
                self._control(controls.pop(0))

    def finish(self) -> None:
        """Rank 0, after `run_root`: STOP to every rank; whatever is still queued gets a 503."""
        self._header(OP_STOP)
        left = list(self.pending)
        self.pending = []
        while True:
            try:
                left.append(self.queue.get_nowait())
            except queue.Empty:
                break
        for j in left:
            j.error = BadRequest(503, "service is shutting down")
            j.on_done(j)

    def _collect(self, controls: list[ControlJob]) -> None:
        """Move queued jobs into `pending` / `controls`: with nothing pending, wait for the first
        (up to the next heartbeat, 50 ms at most) and then `max_wait_ms` for more; else take what
        is there."""
        taken = 0
        if not self.pending:
            wait = min(0.05, max(0.0, self.heartbeat_s - (time.monotonic() - self.last_step_end)))
            try:
                first = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(first, ControlJob):
                controls.append(first)
                return
            self.pending.append(first)
            taken = 1
            deadline = time.monotonic() + self.max_wait_s
        else:
            deadline = 0.0
        while taken < self.max_batch:
            left = deadline - time.monotonic()
            try:
                j = self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(j, ControlJob):
                controls.append(j)
                break
            self.pending.append(j)
            taken += 1

    def _plan(self) -> list[tuple[LookupJob, int, int]]:
        """(job, first bag, end bag) parts of the next step (see the module docstring)."""
        budget = self.max_batch_ids
        parts, whole = [], set()
        for j in self.pending:
            if len(parts) >= self.max_batch:
                break
            units = j.remaining_units()
            if units <= budget:
                parts.append((j, j.cursor, j.num_bags))
                whole.add(id(j))
                budget -= units
        for j in self.pending:
            if id(j) not in whole:
                k = max(1, j.bags_within(max(budget, self.max_batch_ids // 2)))
                parts.append((j, j.cursor, j.cursor + k))
                break
        return parts

    def _lookup_step(self, parts: list[tuple[LookupJob, int, int]]) -> None:
        T = self.bag.num_tables
        idx, off, psw = [None] * T, [None] * T, [None] * T
        by_table: dict[int, list[tuple[LookupJob, int, int]]] = {}
        for p in parts:
            by_table.setdefault(p[0].req.table, []).append(p)
        for t, ps in by_table.items():
            pos, pieces, offs, weights = 0, [], [], []
            for j, c0, c1 in ps:
                o = j.req.bag.offsets
                a, b = int(o[c0]), int(o[c1])
                pieces.append(j.req.bag.indices[a:b])
                offs.append(o[c0:c1] - a + pos)
                w = j.req.bag.per_sample_weights
                weights.append(None if w is None else w[a:b].float())
                pos += b - a
            idx[t] = torch.cat(pieces)
            off[t] = torch.cat(offs + [torch.tensor([pos], dtype=torch.int64)])
            if any(w is not None for w in weights):
                psw[t] = torch.cat([torch.ones(int(p.numel())) if w is None else w for p, w in zip(pieces, weights)])
        error = None
        with self.comm.guard("serve: lookup step"):
            self._header(OP_LOOKUP)
            try:
                outs = self._forward(idx, off, psw)
            except Exception as e:  # noqa: BLE001 - never lose the service over one step
                error = BadRequest(500, f"lookup failed: {type(e).__name__}: {e}")
                traceback.print_exc()
            finally:
                self.comm.barrier()
                self.last_step_end = time.monotonic()
        done = []
        for t, ps in by_table.items():
            res = None if error else outs[t].cpu().numpy()
            b = 0
            for j, c0, c1 in ps:
                n = c1 - c0
                if error is not None:
                    j.error = error
                    j.cursor = j.num_bags
                elif c0 == 0 and c1 == j.num_bags:
                    j.out = res[b: b + n]
                else:
                    if j.out is None:
                        j.out = np.empty((j.num_bags, res.shape[1]), dtype=res.dtype)
                    j.out[c0:c1] = res[b: b + n]
                b += n
                j.cursor = c1
                if j.cursor == j.num_bags:
                    done.append(j)
        finished = {id(j) for j in done}
        self.pending = [j for j in self.pending if id(j) not in finished]
        self.metrics.record_step(sum(j.error is None for j in done), lookup=True)
        for j in done:
            j.on_done(j)

    def _control(self, job: ControlJob) -> None:
        try:
            job.result = self._snapshot(job.arg)
        except Exception as e:  # noqa: BLE001 - reported to the client, the service goes on
            job.error = BadRequest(500, f"snapshot failed: {type(e).__name__}: {e}")
        job.on_done(job)

    def _snapshot(self, path: str) -> dict:
        """Rank 0 reads the tables through the store (one SYNC step per chunk) and writes them
        atomically: `<path>/<table>.npy` each, then `tables.json`."""
        os.makedirs(path, exist_ok=True)
        entries = []
        for t, s in enumerate(self.specs):
            cfg = self.bag.tables[t]

            def fill(mm, t=t, n=cfg.num_embeddings):
                for a in range(0, n, SNAPSHOT_CHUNK_ROWS):
                    rows = np.arange(a, min(n, a + SNAPSHOT_CHUNK_ROWS), dtype=np.int64)
                    mm[a: a + len(rows)] = self.sync_step(lambda rows=rows: self.bag.read_rows(t, rows).numpy())

            write_npy_atomic(os.path.join(path, f"{s.name}.npy"), (cfg.num_embeddings, cfg.embedding_dim),
                             np.float32, fill)
            entries.append({"name": s.name, "path": f"{s.name}.npy", "mode": s.mode, "sharding": s.sharding})
        write_json_atomic(os.path.join(path, "tables.json"), {"tables": entries})
        return {"path": os.path.join(path, "tables.json"), "tables": [e["name"] for e in entries]}
