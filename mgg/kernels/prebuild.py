"""Build many kernel modules at once, ahead of their first use.

`KernelPrebuild(names, archs).start()` hands every (module, architecture) whose cubin is not in
the cache (mgg.kernels.build.cubin_target) to a pool of threads, each running its own nvcc
processes, so the build takes about as long as its slowest module rather than the sum: the
longest builds start first (mgg.kernels.modules: `build_s`), and the compilers run on every CPU
of the machine, not only those the rank is bound to (mpirun --bind-to core, Slurm task binding):
the builder threads drop the binding, which changes no other thread of the process. It runs
in the background: a training run starts it before loading its dataset and waits for it
(`wait`) in its `build` phase, and a module first used before then waits on the same file lock
the pool's build holds. Processes on one node share the cache: a module another process is
building is waited for, not built twice.

`progress(line)` gets one line when builds start ("building 6 CUDA kernels for sm_90 ... 0/6"),
one as each finishes ("... 3/6") and one at the end ("built 6 CUDA kernels for sm_90 in 12.3 s");
nothing when every cubin is cached.

The builder threads are daemons and a process that exits before its builds are done (a run
that failed while loading, say) ends its compiler processes on the way out: it neither waits
for them nor leaves them running.
"""
from __future__ import annotations

import atexit
import os
import queue
import re
import threading
import time
import weakref
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .build import build_cubin, cache_dir, cubin_target, kill_running_builds
from .modules import expand_specs, kernel_module

__all__ = ["KernelPrebuild", "PrebuildResult", "KernelBuildError", "default_jobs", "build_cpus"]


class KernelBuildError(RuntimeError):
    """A kernel module did not build; the message is one line and names the log with the compiler's output."""


@dataclass
class PrebuildResult:
    """What a prebuild did.

    Attributes:
        archs: target architectures (sm_XY).
        names: the build specs asked for (mgg.kernels.modules: "aggregate", "local_csr:fp32").
        built: "spec@arch" -> seconds of the cubins compiled by this process.
        cached: "spec@arch" of the cubins found in the cache (or built meanwhile by another process).
        seconds: wall seconds from `start` to the last module done.
    """

    archs: tuple[str, ...]
    names: tuple[str, ...]
    built: dict[str, float] = field(default_factory=dict)
    cached: list[str] = field(default_factory=list)
    seconds: float = 0.0


def default_jobs(count: int) -> int:
    """Parallel builds: one a module, at most the CPUs the compilers may run on (build_cpus;
    MGG_BUILD_JOBS overrides)."""
    env = os.environ.get("MGG_BUILD_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"MGG_BUILD_JOBS must be a positive integer, got {env!r}") from None
    return max(1, min(int(count), build_cpus()))


def _unbind_thread() -> None:
    """Let the calling thread, and the processes it starts, run on every CPU of the machine that
    the process's cgroup allows (Linux keeps an affinity a thread; a child inherits its parent
    thread's). The other threads keep their binding."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (AttributeError, OSError, ValueError):
        pass


def build_cpus() -> int:
    """How many CPUs the builder threads' compilers run on: those of an unbound thread (whatever
    the binding of the rank's own threads)."""
    found: list[int] = []

    def probe() -> None:
        _unbind_thread()
        try:
            found.append(len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            found.append(os.cpu_count() or 1)

    t = threading.Thread(target=probe, name="mgg-build-cpus")
    t.start()
    t.join()
    return max(1, found[0] if found else 1)


def _key(t) -> str:
    """"local_csr:fp32@sm_90" of a cubin target."""
    return f"{t.name}{':' + t.part if t.part else ''}@{t.arch}"


def _build_seconds(t) -> float:
    """The registered compile seconds of a cubin target (mgg.kernels.modules: `build_s`)."""
    return kernel_module(t.name).build_seconds(t.part)


def _describe(archs: Sequence[str]) -> str:
    return ", ".join(archs)


class KernelPrebuild:
    """Builds `names` (build specs: a module, every part of it, or "module:part") for every
    architecture of `archs` in parallel (see the module docstring).

    `jobs`: parallel builds (default: default_jobs). `progress`: a callable taking one line, or None.
    """

    def __init__(self, names: Sequence[str], archs: Sequence[str], jobs: int | None = None,
                 progress: Callable[[str], None] | None = None):
        self.names, self.archs = tuple(names), tuple(archs)
        self.targets = [cubin_target(n, a, part=p) for a in self.archs
                        for n, p in expand_specs(self.names)]  # ValueError: unknown module or part
        # the longest first: the slowest build does not wait for a free CPU (sorted is stable)
        self.missing = sorted((t for t in self.targets if not t.cached), key=_build_seconds, reverse=True)
        self.result = PrebuildResult(self.archs, self.names,
                                     cached=[_key(t) for t in self.targets if t.cached])
        self.progress = progress
        self.jobs = jobs or default_jobs(len(self.missing))
        self._futures: list[tuple[object, Future]] = []
        self._lock = threading.Lock()
        self._done = 0
        self._t0 = 0.0
        self._cancelled = False
        self._waited = False

    def start(self) -> "KernelPrebuild":
        """Submit the missing modules (none: nothing runs, nothing is printed). Returns self."""
        self._t0 = time.perf_counter()
        if not self.missing:
            return self
        self._say(f"building {len(self.missing)} CUDA kernel{'s' * (len(self.missing) > 1)} for "
                  f"{_describe(self.archs)} ... 0/{len(self.missing)}")
        work: queue.SimpleQueue = queue.SimpleQueue()
        self._futures = [(t, Future()) for t in self.missing]
        for item in self._futures:
            work.put(item)
        _LIVE.add(self)
        for i in range(min(self.jobs, len(self.missing))):
            threading.Thread(target=self._worker, args=(work,), name=f"mgg-build-{i}", daemon=True).start()
        return self

    def _worker(self, work: queue.SimpleQueue) -> None:
        _unbind_thread()
        while not self._cancelled:
            try:
                t, fut = work.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                self._build(t)
            except BaseException as e:  # noqa: BLE001 - handed to wait()
                fut.set_exception(e)
            else:
                fut.set_result(None)

    def cancel(self) -> None:
        """Build nothing more (the builds under way finish, or are killed: kill_running_builds)."""
        self._cancelled = True
        for _, fut in self._futures:
            fut.cancel()

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def _build(self, t) -> None:
        b = build_cubin(t.name, t.arch, t.nvshmem, part=t.part)
        with self._lock:
            key = _key(t)
            if b.cached:
                self.result.cached.append(key)
            else:
                self.result.built[key] = b.seconds
            self._done += 1
            self._say(f"building {len(self.missing)} CUDA kernels for {_describe(self.archs)} ... "
                      f"{self._done}/{len(self.missing)}")

    def wait(self) -> PrebuildResult:
        """Block until every module is built; KernelBuildError (one line, naming a log with the
        compiler's output) when any failed. Safe to call more than once."""
        failures = []
        for t, fut in self._futures:
            try:
                e = fut.exception()
            except CancelledError as c:
                e = c
            if e is not None:
                failures.append((t, e))
        if self._futures and not self._waited:
            self._waited = True
            self.result.seconds = time.perf_counter() - self._t0
            if not failures:
                self._say(f"built {len(self.missing)} CUDA kernel{'s' * (len(self.missing) > 1)} for "
                          f"{_describe(self.archs)} in {self.result.seconds:.1f} s")
        _LIVE.discard(self)
        if failures:
            raise _build_error(failures)
        return self.result


_METHOD_PREFIX = re.compile(r"^_build_\w+: \w+: ")


def _first_error(text: str) -> str:
    """The line of a build failure that says most: the compiler's first error line, else the
    failure's own message (not the command line, not the "building X failed:" header)."""
    lines = [_METHOD_PREFIX.sub("", ln).strip() for ln in text.strip().splitlines()]
    lines = [ln for ln in lines if ln and not (ln.startswith("building ") and ln.endswith("failed:"))]
    body = [ln for ln in lines if not re.match(r"^\S*nvcc\s+-", ln)]
    for ln in body:
        if "error" in ln.lower():
            return ln
    return (body or lines or [text.strip()])[0]


def _build_error(failures: list) -> KernelBuildError:
    """One line naming the failed modules, the first error, and the log that holds every compiler message."""
    log = os.path.join(cache_dir(), "build-errors.log")
    text = "".join(f"== {_key(t)}\n{e}\n" for t, e in failures)
    try:
        with open(log, "a") as f:
            f.write(text)
    except OSError:
        log = ""
    hint = _first_error(str(failures[0][1])) or type(failures[0][1]).__name__
    names = ", ".join(f"{t.name}.cu ({t.part + ', ' if t.part else ''}{t.arch})" for t, _ in failures)
    where = f"; the compiler's output is in {log}" if log else ""
    return KernelBuildError(f"building CUDA kernel {names} failed: {hint[:400]}{where}")


_LIVE: "weakref.WeakSet[KernelPrebuild]" = weakref.WeakSet()  # prebuilds not yet waited for


@atexit.register
def _cancel_all() -> None:
    """At exit: stop every prebuild still running and end its compiler processes."""
    for pre in list(_LIVE):
        pre.cancel()
    kill_running_builds()
