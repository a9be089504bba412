"""Counters of the lookup service (rank 0), read by `GET /v1/metrics`; thread-safe."""
from __future__ import annotations

import threading
import time
from collections import Counter, deque

import numpy as np

__all__ = ["ServiceMetrics"]


class ServiceMetrics:
    """Requests and errors by endpoint and status, lookup latencies (the last 20,000), collective
    steps, lookup passes and batches (passes of whole requests), and the HTTP front's connection
    counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: Counter = Counter()
        self.errors: Counter = Counter()
        self.lat = deque(maxlen=20000)
        self.batches = 0
        self.batched_requests = 0
        self.steps = 0
        self.passes = 0
        self.connections: Counter = Counter()  # opened, evicted (idle, at the limit), refused (all busy)
        self.open_connections = 0
        self.started = time.time()

    def record(self, endpoint: str, status: int, seconds: float | None) -> None:
        with self.lock:
            self.requests[endpoint] += 1
            if status >= 400:
                self.errors[str(status)] += 1
            if seconds is not None and status == 200:
                self.lat.append(seconds)

    def record_step(self) -> None:
        """One collective step (of lookup passes, or a heartbeat / snapshot step)."""
        with self.lock:
            self.steps += 1

    def record_pass(self, requests_done: int, batch: bool) -> None:
        """One lookup pass; `requests_done` lookups finished in it; `batch`: a pass of whole
        requests (else a part of a large one)."""
        with self.lock:
            self.passes += 1
            if batch:
                self.batches += 1
                self.batched_requests += requests_done

    def connection(self, event: str, open_now: int) -> None:
        with self.lock:
            self.connections[event] += 1
            self.open_connections = open_now

    def snapshot(self) -> dict:
        with self.lock:
            lat = np.asarray(self.lat, dtype=np.float64) * 1e3
            pct = {f"p{q}": (float(np.percentile(lat, q)) if lat.size else None) for q in (50, 90, 99)}
            return {"uptime_s": time.time() - self.started, "requests": dict(self.requests),
                    "requests_total": int(sum(self.requests.values())), "errors": dict(self.errors),
                    "errors_total": int(sum(self.errors.values())),
                    "lookup_latency_ms": {**pct, "count": int(lat.size)},
                    "batches": self.batches, "batched_requests": self.batched_requests,
                    "mean_batch_size": self.batched_requests / self.batches if self.batches else None,
                    "collective_steps": self.steps, "lookup_passes": self.passes,
                    "connections": {"open": self.open_connections, **dict(self.connections)}}
