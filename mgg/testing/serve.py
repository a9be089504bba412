"""Helpers for tests and benchmarks of the lookup service: a float64 EmbeddingBag reference and
an `mpirun ... python -m mgg.serve` process on a loopback port."""
from __future__ import annotations

import http.client
import io
import os
import re
import subprocess
import sys
import time

import numpy as np

__all__ = ["bag_reference", "npz_bytes", "ServiceProcess", "rank_pids", "peak_rss_bytes", "reset_peak_rss"]


def bag_reference(W: np.ndarray, idx, off, mode: str, psw=None) -> np.ndarray:
    """torch.nn.EmbeddingBag(mode)(idx, off) in float64 with numpy: [len(off), D]; empty bags 0."""
    idx, off = np.asarray(idx, dtype=np.int64), np.asarray(off, dtype=np.int64)
    ends = list(off[1:]) + [len(idx)]
    out = np.zeros((len(off), W.shape[1]), dtype=np.float64)
    for i, (a, b) in enumerate(zip(off, ends)):
        if b > a:
            rows = W[idx[a:b]].astype(np.float64)
            if psw is not None:
                rows = rows * np.asarray(psw[a:b], dtype=np.float64)[:, None]
            out[i] = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.max(0)}[mode]
    return out


def npz_bytes(**arrays) -> bytes:
    b = io.BytesIO()
    np.savez(b, **arrays)
    return b.getvalue()


class ServiceProcess:
    """`mpirun_prefix + [python, -m, mgg.serve, --tables, T, --port, 0, *extra]`, started and
    waited for until it prints its URL (`url`, `host`, `port`)."""

    def __init__(self, mpirun_prefix: list[str], tables_json, *extra: str, env=None, cwd=None, start_timeout=90):
        self.proc = subprocess.Popen([*mpirun_prefix, sys.executable, "-m", "mgg.serve", "--tables", str(tables_json),
                                      "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=cwd)
        deadline = time.time() + start_timeout
        while True:
            line = self.proc.stdout.readline()
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                break
            if not line and self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(f"service did not start: {self.proc.stderr.read()[-3000:]}")
        self.host, port = self.url[7:].split(":")
        self.port = int(port)

    def raw(self, method, path, body=b"", headers=None, timeout=60):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def bodiless_post(self, path):
        """POST with no body and no Content-Length header (what `curl -X POST URL` sends)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=30)
        c.putrequest("POST", path)
        c.endheaders()
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def wait(self, timeout=30):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def rank_pids(launcher_pid: int) -> list[int]:
    """Pids of the Python processes below an mpirun (Linux /proc)."""
    todo, found = [launcher_pid], []
    while todo:
        for c in _children(todo.pop()):
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            (found if b"mgg.serve" in cmd and b"python" in cmd.split(b"\0")[0] else todo).append(c)
    return sorted(found)


def peak_rss_bytes(pid: int) -> int:
    """VmHWM (the peak resident set) of a process, bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def reset_peak_rss(pid: int) -> None:
    """Linux: VmHWM of `pid` restarts from its current resident set."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
