"""The manifest of one benchmark run: what ran, where, on what, with which versions.

Every `bench/run.sh` run writes `<root>/<date>-<gpu>x<count>-<commit>/manifest.json`:

    {"command": str, "suites": [str], "stages": [{"name", "rc", "seconds"}], "commit": str,
     "dirty": bool, "host": str, "gpus": [str], "gpu_count": int,
     "versions": {"python", "torch", "cupy", "nvshmem", "mpi4py", "numpy": str | None},
     "started": ISO-8601 UTC, "ended": ISO-8601 UTC | None, "reconstructed": [field names]}

`reconstructed` lists the fields filled in after the fact (for runs older than this runner; empty
for runs it wrote). Versions are read from the installed distributions (no import, no GPU needed).

    python bench/manifest.py begin ROOT --suites "S1 S2" --command "bench/run.sh S1 S2"   # makes the folder, prints it
    python bench/manifest.py end DIR                                  # end time + stages.tsv
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata

__all__ = ["collect", "run_dir_name", "gpu_slug", "package_versions", "write_manifest", "finish"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: version key -> distribution names to try, first found wins
_DISTS = {
    "torch": ("torch",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "nvshmem": ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12", "nvshmem4py-cu13", "nvshmem4py-cu12"),
    "mpi4py": ("mpi4py",),
    "numpy": ("numpy",),
}


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def package_versions() -> dict[str, str | None]:
    """Python and the installed versions of torch, cupy, nvshmem, mpi4py, numpy (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for key, names in _DISTS.items():
        out[key] = None
        for name in names:
            try:
                out[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def gpu_names() -> list[str]:
    """The GPUs' names from nvidia-smi ([] without one)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else []


def gpu_slug(gpus: list[str]) -> str:
    """"h200x2" for two "NVIDIA H200"; "cpu" for none; the model of the first GPU, lower case."""
    if not gpus:
        return "cpu"
    words = [w for w in re.split(r"[\s_-]+", gpus[0]) if w and w.upper() not in ("NVIDIA", "TESLA", "GEFORCE")]
    model = re.sub(r"[^a-z0-9]", "", (words[0] if words else "gpu").lower()) or "gpu"
    return f"{model}x{len(gpus)}"


def git_commit(root: str = ROOT) -> tuple[str, bool]:
    """(short commit, whether the work tree has uncommitted changes); ("unknown", False) outside git."""
    try:
        c = subprocess.run(["git", "-C", root, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                           timeout=30)
        d = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", False
    if c.returncode != 0:
        return "unknown", False
    return c.stdout.strip(), bool(d.stdout.strip())


def run_dir_name(date: str, gpus: list[str], commit: str) -> str:
    """`<date>-<gpu>x<count>-<commit>`, e.g. "2026-11-23-h200x2-b618618" (date "YYYY-MM-DD")."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise ValueError(f"date must be YYYY-MM-DD, got {date!r}")
    return f"{date}-{gpu_slug(gpus)}-{commit}"


def collect(command: str, suites: list[str], *, started: str | None = None, gpus: list[str] | None = None,
            commit: str | None = None, root: str = ROOT) -> dict:
    """The manifest dict of a run starting now (or at `started`); `gpus`/`commit` default to this machine's."""
    sha, dirty = git_commit(root) if commit is None else (commit, False)
    gpus = gpu_names() if gpus is None else list(gpus)
    return {"command": command, "suites": list(suites), "stages": [], "commit": sha, "dirty": dirty,
            "host": socket.gethostname(), "gpus": gpus, "gpu_count": len(gpus), "versions": package_versions(),
            "started": started or _utc_now(), "ended": None, "reconstructed": []}


def write_manifest(path: str, doc: dict) -> None:
    """Write `doc` as indented JSON (atomically: a temporary file, then rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def begin(results_root: str, command: str, suites: list[str]) -> str:
    """Make the run folder under `results_root` (a "-2", "-3"... suffix when taken), write its
    manifest, return the folder."""
    doc = collect(command, suites)
    name = run_dir_name(doc["started"][:10], doc["gpus"], doc["commit"])
    path, k = os.path.join(results_root, name), 1
    while os.path.exists(path):
        k += 1
        path = os.path.join(results_root, f"{name}-{k}")
    os.makedirs(path)
    write_manifest(os.path.join(path, "manifest.json"), doc)
    return path


def finish(run_dir: str) -> dict:
    """Set the end time and the stages (from `stages.tsv`: name, exit code, seconds per line)."""
    mpath = os.path.join(run_dir, "manifest.json")
    with open(mpath, encoding="utf-8") as f:
        doc = json.load(f)
    stages = []
    tsv = os.path.join(run_dir, "stages.tsv")
    if os.path.exists(tsv):
        with open(tsv, encoding="utf-8") as f:
            for ln in f:
                name, rc, secs = ln.rstrip("\n").split("\t")
                stages.append({"name": name, "rc": int(rc), "seconds": int(secs)})
    doc["stages"], doc["ended"] = stages, _utc_now()
    write_manifest(mpath, doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("begin", help="make the run folder and its manifest; print the folder")
    b.add_argument("root")
    b.add_argument("--suites", required=True, help="space-separated suite names")
    b.add_argument("--command", required=True, help="the command line of the run")
    e = sub.add_parser("end", help="record the end time and the stages of a run folder")
    e.add_argument("dir")
    args = ap.parse_args(argv)
    if args.what == "begin":
        print(begin(args.root, args.command, args.suites.split()))
    else:
        finish(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
