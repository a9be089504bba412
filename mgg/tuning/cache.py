"""The persisted tuning cache and the tuning log (both JSON, written atomically).

Cache file (one per cluster/user, many entries):

    {"format": "mgg-tuning-cache", "version": 1,
     "entries": {"<key id>": {"key": {...TuneKey}, "best": {...TuneConfig}, "latency_ms": 1.23,
                              "trials": 14, "updated": "2026-...Z"}}}

An entry is found by the exact key: graph fingerprint, world size, embedding dim, GPU model name,
kernel version (and a free `extra` string, e.g. the aggregation kinds or the variants tried).
A second run with the same key starts at the best configuration with zero search iterations.

A file that does not parse (or is not a tuning cache) is never overwritten: it is renamed to
`<path>.corrupt` (`.corrupt.1`, ... if taken) with a warning, and the cache starts empty.

Log file (one per tuning run; `python -m mgg.tune --report PATH` reads it):

    {"format": "mgg-tuning-log", "version": 1, "key": {...}, "dim": D, "limits": {...},
     "space": {...}, "from_cache": false, "trials": [{"step", "ps", "dist", "wpb", "ps_inter",
     "variant", "latency_ms", "phase"}, ...], "best": {...}, "best_latency_ms": x,
     "grid": [{"ps", "dist", "wpb", "variant", "ps_inter", "latency_ms"}, ...]  (optional:
     an exhaustive sweep, bench/tune_grid.py)}
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass

from ..atomic import atomic_write_json
from .model import TuneConfig

__all__ = ["TuneKey", "CacheEntry", "TuningCache", "atomic_write_json", "kernel_version",
           "read_log", "LOG_FORMAT", "CACHE_FORMAT"]

log = logging.getLogger("mgg.tuner")

CACHE_FORMAT = "mgg-tuning-cache"
LOG_FORMAT = "mgg-tuning-log"
VERSION = 1


def kernel_version() -> str:
    """mgg's version plus a digest of the CUDA sources in mgg/kernels: a kernel change
    invalidates the cache entries tuned for the old kernels."""
    from ..version import version

    h = hashlib.blake2b(digest_size=6)
    kdir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
    for p in sorted(glob.glob(os.path.join(kdir, "*.cu")) + glob.glob(os.path.join(kdir, "*.cuh"))):
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as fh:
            h.update(fh.read())
    return f"{version()}+{h.hexdigest()}"


@dataclass(frozen=True)
class TuneKey:
    """What a tuned configuration is valid for."""

    fingerprint: str      # e.g. Graph.fingerprint()
    world_size: int
    dim: int              # the largest embedding width the aggregations see
    device: str           # GPU model name (DeviceLimits.name), "cpu" on the CPU path
    kernel_version: str   # e.g. kernel_version()
    extra: str = ""       # anything else that changes the optimum (kinds, variants, ps_inter)

    def id(self) -> str:
        return "|".join([self.fingerprint, f"P{self.world_size}", f"D{self.dim}", self.device,
                         self.kernel_version, self.extra])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TuneKey":
        return cls(str(d["fingerprint"]), int(d["world_size"]), int(d["dim"]), str(d["device"]),
                   str(d["kernel_version"]), str(d.get("extra", "")))


@dataclass(frozen=True)
class CacheEntry:
    key: TuneKey
    best: TuneConfig
    latency_ms: float
    trials: int
    updated: str = ""

    def to_dict(self) -> dict:
        return {"key": self.key.to_dict(), "best": self.best.to_dict(),
                "latency_ms": self.latency_ms, "trials": self.trials, "updated": self.updated}

    @classmethod
    def from_dict(cls, d: dict) -> "CacheEntry":
        return cls(TuneKey.from_dict(d["key"]), TuneConfig.from_dict(d["best"]),
                   float(d["latency_ms"]), int(d["trials"]), str(d.get("updated", "")))


def _set_aside(path: str, why: str) -> str:
    """Rename a damaged file to <path>.corrupt[.N]; returns the new name."""
    dst = path + ".corrupt"
    n = 0
    while os.path.exists(dst):
        n += 1
        dst = f"{path}.corrupt.{n}"
    os.replace(path, dst)
    log.warning("tuning cache %s is unreadable (%s): moved to %s, starting empty", path, why, dst)
    return dst


class TuningCache:
    """A JSON file of best configurations keyed by `TuneKey`.

    `lookup` never raises on a damaged file (it warns and sets the file aside); `store`
    re-reads the file before writing so concurrent runs with other keys are not lost (last
    writer wins per key), and writes atomically.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.set_aside: str | None = None  # where a corrupt file went, if one was found

    def _read(self) -> dict[str, dict]:
        try:
            with open(self.path, "r", encoding="utf-8") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("cannot read tuning cache %s: %s (ignored)", self.path, e)
            return {}
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or obj.get("format") != CACHE_FORMAT:
                raise ValueError("not an mgg tuning cache")
            if int(obj.get("version", 0)) > VERSION:
                raise ValueError(f"format version {obj.get('version')} is newer than {VERSION}")
            entries = obj.get("entries")
            if not isinstance(entries, dict):
                raise ValueError("no entries")
            for e in entries.values():  # validate every entry's shape
                CacheEntry.from_dict(e)
            return entries
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self.set_aside = _set_aside(self.path, str(e)[:200])
            return {}

    def lookup(self, key: TuneKey) -> CacheEntry | None:
        """The entry for `key`, or None (missing file, missing key, or a damaged file)."""
        e = self._read().get(key.id())
        return None if e is None else CacheEntry.from_dict(e)

    def store(self, key: TuneKey, best: TuneConfig, latency_ms: float, trials: int) -> CacheEntry:
        entries = self._read()
        entry = CacheEntry(key, best, float(latency_ms), int(trials),
                           time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        entries[key.id()] = entry.to_dict()
        atomic_write_json(self.path, {"format": CACHE_FORMAT, "version": VERSION, "entries": entries})
        return entry

    def entries(self) -> list[CacheEntry]:
        return [CacheEntry.from_dict(e) for e in self._read().values()]


def read_log(path: str | os.PathLike) -> dict:
    """Load and check a tuning log. Raises ValueError with the reason when it is not one."""
    path = os.fspath(path)
    try:
        with open(path, "r", encoding="utf-8") as fh:
            obj = json.load(fh)
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from e
    if not isinstance(obj, dict) or obj.get("format") != LOG_FORMAT:
        raise ValueError(f"{path}: not an mgg tuning log (format {LOG_FORMAT!r} expected)")
    for name in ("trials", "grid"):
        rows = obj.get(name, [])
        if not isinstance(rows, list):
            raise ValueError(f"{path}: {name} must be a list")
        for i, r in enumerate(rows):
            try:
                TuneConfig.from_dict(r)
                float(r["latency_ms"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: {name}[{i}] is malformed: {e}") from e
    obj.setdefault("grid", [])
    return obj
