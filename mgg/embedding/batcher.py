"""The service's batcher: rank 0 turns queued lookups into collective steps of bounded lookup
passes; the other ranks join every step.

Rank 0's main thread loops:

* takes the queued jobs (after the first of an idle spell it waits `max_wait_ms` for more, up to
  `max_batch` requests);
* runs one collective step: broadcasts the header (`Ibcast`), looks up in passes while the other
  ranks wait in the step's closing barrier (serving their slices to rank 0's one-sided gets), then
  the barrier. A pass is
  - one `MultiTableEmbeddingBag.forward` of the pending requests of at most `max_batch_ids` work
    units (a unit is one id or one bag) that fit, whole, in `max_batch_ids` units together, in
    arrival order; their answers go out right after it;
  - then one forward of the next part of the oldest larger request: at most `max_batch_ids` ids
    and as many bags (`LookupJob.next_part`; a bag larger than that is split and its pieces are
    combined);
  between passes the requests that arrived meanwhile join. The step ends when nothing is pending
  or after `heartbeat_s`. So a small request waits for at most one pass of a large one, never for
  its remaining work, and a large request's collective synchronisations are spread over many
  passes;
* when idle, a SYNC step (header + barrier) every `heartbeat_s`, so a dead or stopped rank shows
  within seconds even without traffic;
* snapshots between steps: rank 0 reads every table through the store, one SYNC step per
  64K-row chunk, writing each table to a temp file then `os.replace`;
* when `stop` is set (shutdown endpoint, SIGTERM/SIGINT), a STOP header: every rank leaves.

The other ranks wait for headers and barriers with nonblocking calls polled between 0.2 ms sleeps,
so they do not spin a core while rank 0 works. Every step is armed on every rank with the
communicator's watchdog (`Communicator.guard`), and the other ranks arm their wait for the next
header too: a stuck or dead rank ends the job (MPI_Abort, message on stderr) after the watchdog
timeout instead of hanging. `stalled_s()` (seconds since a step last completed) is what
`/v1/health` reports.
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
from .lookup_job import JobPart, LookupJob
from .lookup_request import BadRequest
from .service_metrics import ServiceMetrics

__all__ = ["LookupJob", "ControlJob", "LookupBatcher", "OP_LOOKUP", "OP_SYNC", "OP_STOP", "CONTROL_SNAPSHOT"]

OP_LOOKUP, OP_SYNC, OP_STOP = 1, 2, 3  # step headers
CONTROL_SNAPSHOT = "snapshot"
SNAPSHOT_CHUNK_ROWS = 1 << 16
POLL_S = 0.0002  # the other ranks' sleep between tests of a pending header or barrier


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
        """Ranks > 0: the next step's op."""
        hdr = np.zeros(2, dtype=np.int64)
        self._poll(self.comm.comm.Ibcast(hdr, root=0))
        return int(hdr[0])

    @staticmethod
    def _poll(req) -> None:
        """Ranks > 0: wait for a nonblocking collective with short sleeps (an idle rank does not spin)."""
        while not req.Test():
            time.sleep(POLL_S)

    def _close_step(self) -> None:
        """The barrier that ends a step (rank 0 arrives last: its wait is short)."""
        if self.comm.size > 1:
            self.comm.comm.Ibarrier().Wait()

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
                self._close_step()
                self.last_step_end = time.monotonic()
                self.metrics.record_step()

    def run_worker(self) -> None:
        while True:
            with self.comm.guard("serve: waiting for rank 0's next step"):
                op = self._wait_header()
            if op == OP_STOP:
                return
            with self.comm.guard("serve: lookup step" if op == OP_LOOKUP else "serve: sync step"):
                self._poll(self.comm.comm.Ibarrier())

    # -- rank 0 ------------------------------------------------------------------------------------
    def run_root(self, stop: threading.Event) -> None:
        """Serve until `stop` is set (by STOP, a signal or the front); the caller then calls `finish`."""
        self.last_step_end = time.monotonic()
        controls: list[ControlJob] = []
        while not stop.is_set():
            self._collect(controls)
            self.pending = [j for j in self.pending if not j.cancelled]
            if self.pending:
                self._lookup_step(stop, controls)
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

    def _collect(self, controls: list[ControlJob], wait: bool = True) -> None:
        """Move queued jobs into `pending` / `controls`: with nothing pending and `wait`, wait for
        the first (up to the next heartbeat, 50 ms at most) and then `max_wait_ms` for more; else
        take what is there."""
        taken = 0
        if not self.pending and wait:
            wait_s = min(0.05, max(0.0, self.heartbeat_s - (time.monotonic() - self.last_step_end)))
            try:
                first = self.queue.get(timeout=wait_s) if wait_s > 0 else self.queue.get_nowait()
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

    def _lookup_step(self, stop: threading.Event, controls: list[ControlJob]) -> None:
        """One collective step of lookup passes (see the module docstring)."""
        t0 = time.monotonic()
        with self.comm.guard("serve: lookup step"):
            self._header(OP_LOOKUP)
            try:
                while self.pending and not stop.is_set():
                    self._pass()
                    if controls or time.monotonic() - t0 >= self.heartbeat_s:
                        break
                    self._collect(controls, wait=False)
                    self.pending = [j for j in self.pending if not j.cancelled]
            finally:
                self._close_step()
                self.last_step_end = time.monotonic()
                self.metrics.record_step()

    def _pass(self) -> None:
        """The pending requests that fit whole, then the next part of the oldest larger one."""
        whole, large, budget = [], None, self.max_batch_ids
        for j in self.pending:
            units = j.remaining_units()
            if j.chunked or units > self.max_batch_ids:
                large = large or j
            elif len(whole) < self.max_batch and units <= budget:
                whole.append(j)
                budget -= units
        if whole:
            self._run([j.whole_part() for j in whole])
        if large is not None and not large.cancelled:
            self._run([large.next_part(self.max_batch_ids)])

    def _run(self, parts: list[JobPart]) -> None:
        """One forward of `parts` (grouped by table); finished jobs are answered right away."""
        T = self.bag.num_tables
        idx, off, psw = [None] * T, [None] * T, [None] * T
        by_table: dict[int, list[JobPart]] = {}
        for p in parts:
            by_table.setdefault(p.job.req.table, []).append(p)
        for t, ps in by_table.items():
            pos, pieces, offs, weights = 0, [], [], []
            for p in ps:
                bag = p.job.req.bag
                pieces.append(bag.indices[p.u: p.u1])
                offs.append(torch.from_numpy(p.local_offsets() + pos))
                w = bag.per_sample_weights
                weights.append(None if w is None else w[p.u: p.u1].float())
                pos += p.u1 - p.u
            idx[t] = torch.cat(pieces)
            off[t] = torch.cat(offs + [torch.tensor([pos], dtype=torch.int64)])
            if any(w is not None for w in weights):
                psw[t] = torch.cat([torch.ones(int(p.numel())) if w is None else w for p, w in zip(pieces, weights)])
        error = None
        try:
            outs = self._forward(idx, off, psw)
        except Exception as e:  # noqa: BLE001 - never lose the service over one pass
            error = BadRequest(500, f"lookup failed: {type(e).__name__}: {e}")
            traceback.print_exc()
        done = []
        for t, ps in by_table.items():
            res = None if error else outs[t].cpu().numpy()
            b = 0
            for p in ps:
                j, k = p.job, p.e - p.c
                if error is not None:
                    j.error = error
                    j.bag_cursor = j.num_bags
                else:
                    j.take(p, res[b: b + k], self.bag.tables[t].mode)
                b += k
                if j.done:
                    done.append(j)
        finished = {id(j) for j in done}
        self.pending = [j for j in self.pending if id(j) not in finished]
        self.metrics.record_pass(sum(j.error is None for j in done), batch=all(p.whole for p in parts))
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
