"""The memory check before the long wait: estimate a run's host and GPU memory from the graph's
size (read without loading it), the widths, P and the mode, and refuse a run that cannot fit.
`estimate` is the one estimate: `python -m mgg.prepare FILE --ranks P` prints it for the file,
and `python -m mgg.train` checks it before loading (with C = 64 classes) and again once the
labels are read (with the file's C), so both say the same for the same file and P.

Estimate per rank (bytes; N nodes, E edges, F feature width, H hidden width, L layers, C
classes, P ranks, n = ceil(N / P) rows and e = E / P edges of a rank):

    host = 0.55 GiB                                    interpreter, torch, MPI, allocator slack
         + 24 N                                        indptr and degrees, whole (a CSR .npz that
                                                       full-graph mode memory-maps: stored int64
                                                       indices, what mgg.prepare writes)
           or 24 E + 2 N (4 F + 19)                    the graph whole (any other file, presets,
                                                       --mode sampled); twice for a generated preset
         + 44 e                                        this rank's rows, plans of both directions
                                                       (and of the row sets), the CPU executors'
                                                       sparse matrices
         + n (4 F + 19)                                [GPU backend] this rank's node data
         + n (12 F + 24 H L + 8 C + 64) + W           [CPU backend] x, the first layer's cached input
                                                       aggregation and its dropped input; H-wide
                                                       activations and gradients; logits; labels,
                                                       masks and per-row plan arrays; weights
    gpu  = 4 n F + max(B e, T e + 12 n H L             (GPU backend, full graph: x; the startup peak,
                 + 4 n C + 6.4 h H) + W + 0.5 GiB      whose transposed rows and plans are built on
                                                       the GPU, or the training peak: plans of both
                                                       directions and the row sets, H-wide
                                                       activations and gradients, the logits, and
                                                       the halo buffers; B = 60, T = 16 at P = 1;
                                                       B = 76, T = 32 and h = min(N - n, e) halo
                                                       rows (at most) at P > 1)
           or 48 e + 12 n F + W + 0.5 GiB              (GPU backend, --mode sampled)

with W = 16 (F H + H^2 (L - 2) + C H): weights, gradients and Adam's moments. C = 64 before the
labels are read; once they are (mgg.apps.classes) the run is checked again with its C (a stray
label of 10^9, given as --num-classes, is refused here rather than in an allocation).

The full-graph GPU coefficients are fitted to torch's peak allocation on the largest rank
(`max_gpu_peak_mb` of the metrics JSON) of `python -m mgg.train --dataset FILE --model M`
(default flags) on 4x H200 (bench/results/2026-11-28-h200x4-71eded6, members c10/-c14/):
reddit-like, products-like and papers-like@0.3, GCN and GIN, P = 1 and 4; the estimate is
0.99-1.22x the measured peak on all eleven (papers-like@0.3 GCN at P = 1: 61.1 GB estimated,
60.3 GB measured, on a GPU with 141 GB).

The host coefficients are fitted to the peak RSS of every rank (`/usr/bin/time -f %M`) of
`mpirun -np P python -m mgg.train --dataset FILE --epochs 2 --backend cpu` (GCN 2x16, the
defaults) on files written by `python -m mgg.prepare`; docs/datasets.md lists the runs and the
estimate next to each (within 0.9-1.15x of the largest rank's peak). A run is refused when the
ranks of one node need more than what the host has available (MemAvailable, or the cgroup limit
minus usage when lower) or one rank needs more GPU memory than its GPU has free; `--force` trains
anyway. `MGG_MEMORY_AVAILABLE` (bytes) overrides the host figure (tests).
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

__all__ = ["GraphSize", "MemoryEstimate", "graph_size", "estimate", "host_available", "check_memory",
           "ASSUMED_CLASSES", "estimate_line"]

GIB = 2**30
_BASE_HOST = int(0.55 * GIB)
_BASE_GPU = int(0.5 * GIB)
#: classes the estimate assumes before the labels are read
ASSUMED_CLASSES = 64


@dataclass(frozen=True)
class GraphSize:
    """Sizes of a dataset, known without loading it."""

    nodes: int
    edges: int
    features: int
    generated: bool = False
    mapped: bool = False     # a CSR .npz that full-graph training memory-maps (each rank reads its rows)


@dataclass(frozen=True)
class MemoryEstimate:
    host_per_rank: int       # bytes
    gpu_per_rank: int        # bytes (0 on the CPU backend)


def _npz_headers(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype, bool]]:
    """(shape, dtype, stored uncompressed) of an .npz's members from their .npy headers (no array
    is read)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype, bool]] = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
            out[info.filename[:-4]] = (tuple(shape), dtype, info.compress_type == zipfile.ZIP_STORED)
    return out


def graph_size(dataset: str, scale: float = 1.0) -> GraphSize | None:
    """The dataset's size without loading it: presets from their table, .npz from the member
    headers; None when it cannot be told cheaply (small built-ins, edge lists, folders)."""
    from ..data.generators import PRESETS, preset_sizes

    key = os.fspath(dataset)
    if key.lower() in ("default", "karate"):
        return GraphSize(34, 156, 34)
    if key.lower() == "sbm":
        n = max(7, int(round(10_000 * scale)))
        return GraphSize(n, 10 * n, 32, generated=True)
    if key.lower() in PRESETS:
        n, e = preset_sizes(key.lower(), scale)
        return GraphSize(n, e, PRESETS[key.lower()].num_features, generated=True)
    if key.lower().endswith(".npz") and os.path.isfile(key):
        try:
            headers = _npz_headers(key)
        except Exception:  # noqa: BLE001 - any damage: no estimate here, the loader names the problem
            return None
        shapes = {k: v[0] for k, v in headers.items()}
        mapped = False
        if "indptr" in shapes and "indices" in shapes:
            n, e = shapes["indptr"][0] - 1, shapes["indices"][0]
            # what load_npz(mmap=True) maps: stored int64 indices (node data mapped when stored)
            _, idt, stored = headers["indices"]
            mapped = stored and idt == np.int64
        elif "edge_index" in shapes and len(shapes["edge_index"]) == 2:
            e = shapes["edge_index"][1]
            n = shapes["x"][0] if "x" in shapes else (shapes["y"][0] if "y" in shapes else 0)
        else:
            return None
        f = shapes["x"][1] if len(shapes.get("x", ())) == 2 else 2
        return GraphSize(int(n), int(e), int(f), mapped=mapped)
    return None


def estimate(size: GraphSize, hidden: int, layers: int, world_size: int, gpu: bool,
             mode: str = "full", classes: int = ASSUMED_CLASSES) -> MemoryEstimate:
    """Bytes per rank of a run (see the module docstring for the formula); --mode sampled keeps
    no whole-graph activations (its batches are small) and reads the graph whole."""
    n_all, e_all, f = size.nodes, size.edges, max(size.features, 1)
    p = max(1, world_size)
    n = -(-n_all // p)
    e = e_all // p
    classes = max(int(classes), 1)
    if size.mapped and mode == "full":  # indptr and degrees whole; each rank reads its own rows
        graph = 24 * n_all
    else:
        graph = 24 * e_all + n_all * (4 * f + 19) * 2
        if size.generated:
            graph *= 2
    # weights, gradients and Adam's two moments (float32) of a stack F -> H -> ... -> C classes
    params = 16 * (f * hidden + hidden * hidden * max(0, layers - 2) + hidden * classes)
    host = _BASE_HOST + graph + 44 * e
    if mode == "sampled":
        host += params
    elif gpu:
        host += n * (4 * f + 19)
    else:
        host += n * (12 * f + 24 * hidden * layers + 8 * classes + 64) + params
    gpu_bytes = 0
    if gpu and mode == "sampled":
        gpu_bytes = 48 * e + 12 * n * f + params + _BASE_GPU
    elif gpu:
        halo = min(n_all - n, e) if p > 1 else 0  # rows a rank may read from the others (at most)
        build = (60 if p == 1 else 76) * e
        train = ((16 if p == 1 else 32) * e + 12 * n * hidden * layers + 4 * n * classes
                 + 6.4 * halo * hidden)
        gpu_bytes = 4 * n * f + max(build, train) + params + _BASE_GPU
    return MemoryEstimate(int(host), int(gpu_bytes))


def host_available() -> int:
    """Bytes this host can still give: MemAvailable, lowered to the cgroup's limit minus usage."""
    env = os.environ.get("MGG_MEMORY_AVAILABLE")
    if env:
        return int(float(env))
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as fh:
                raw = fh.read().strip()
            if raw == "max":
                continue
            with open(usage_file) as fh:
                free = int(raw) - int(fh.read().strip())
            avail = free if avail is None else min(avail, free)
        except (OSError, ValueError):
            continue
    return avail if avail is not None else 1 << 62


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def check_memory(dataset: str, scale: float, hidden: int, layers: int, world_size: int, ranks_on_node: int,
                 gpu: bool, gpu_free: int | None = None, mode: str = "full", classes: int = ASSUMED_CLASSES,
                 size: GraphSize | None = None) -> str:
    """"" when the run fits (or its size is unknown), else the one-line reason with the estimate
    and what is available. `size`: the dataset's, when it is already loaded (else `graph_size`)."""
    size = graph_size(dataset, scale) or size
    if size is None:
        return ""
    est = estimate(size, hidden, layers, world_size, gpu, mode, classes)
    need = est.host_per_rank * max(1, ranks_on_node)
    have = host_available()
    what = f"{dataset} ({size.nodes:,} nodes, {size.edges:,} edges, {size.features} features"
    what += f", {classes:,} classes)" if classes > ASSUMED_CLASSES else ")"
    fewer = ", fewer classes" if classes > ASSUMED_CLASSES else ""
    if need > have:
        if size.generated:
            smaller = "a smaller --scale"
        else:  # a file has one size: a smaller one is written once, from the preset or the file
            smaller = "a smaller graph file (python -m mgg.prepare PRESET --scale S --out FILE)"
        fewer_ranks = "fewer ranks on this node (more nodes)" if ranks_on_node > 1 else "more nodes"
        return (f"not enough host memory for {what} on {world_size} rank(s): about {_gib(need)} needed "
                f"on this node ({_gib(est.host_per_rank)} per rank x {ranks_on_node}), {_gib(have)} available; "
                f"use {fewer_ranks}, {smaller}, a smaller --hidden{fewer}, or --force to try anyway")
    if gpu and gpu_free is not None and est.gpu_per_rank > gpu_free:
        return (f"not enough GPU memory for {what} on {world_size} GPU(s): about {_gib(est.gpu_per_rank)} "
                f"per GPU needed, {_gib(gpu_free)} free; use more GPUs, a smaller --hidden{fewer}, or --force")
    return ""


def estimate_line(size: GraphSize, est: MemoryEstimate, world_size: int, hidden: int, layers: int,
                  classes: int, gpu: bool) -> str:
    """The line `python -m mgg.prepare --ranks P` prints: `estimate`'s figures for P ranks on one
    node, the same `python -m mgg.train` checks for that file and P."""
    line = (f"mgg.train estimate ({'gpu' if gpu else 'cpu'} backend, {layers} layers of {hidden}, {classes} classes): "
            f"{_gib(est.host_per_rank)} host a rank, {_gib(est.host_per_rank * world_size)} for {world_size} "
            f"rank(s) on one node")
    if gpu:
        line += f", {_gib(est.gpu_per_rank)} a GPU"
    return line + f"; this host has {_gib(host_available())} available"
