"""The memory check before the long wait: estimate a run's host and GPU memory from the graph's
size (read without loading it), the widths, P and the mode, and refuse a run that cannot fit.

Estimate per rank (bytes; N nodes, E edges, F feature width, H hidden width, L layers, P ranks,
n = N / P rows of this rank):

    host = 24 E + N (4 F + 19) * 2                       graph (indptr, int64 indices, x, y, masks;
                                                          x twice: the file and its prepared copy)
           or, for a CSR .npz that full-graph mode memory-maps (stored, int64 indices: what
           `python -m mgg.prepare` and `save_npz` write), where each rank reads only its rows:
           24 N + 2 (8 E / P + n (4 F + 19))             indptr and degrees whole; the rank's rows
                                                          mapped from the file, then copied
         + 48 E / P                                       this rank's rows and plans (both directions)
         + [CPU backend] 16 n max(F, H) L + 4 n F + W       activations kept for the backward, the
                                                          first layer's cached input aggregation
                                                          (mgg.nn.input_cache), weights
         + 0.35 GiB                                       interpreter, torch, MPI
    gpu  = 48 E / P + 12 n F + 16 n H L + W + 0.5 GiB   (GPU backend: plans of both directions and
                                                          the row sets; x, one F-wide temporary and
                                                          the cached input aggregation;
                                                          H-wide activations, the models aggregating
                                                          on the narrow side)

with W = 16 (F H + H^2 (L - 2) + C H): weights, gradients and Adam's moments, for C = 64 classes
before the labels are read. Once they are (mgg.apps.classes), a run of C > 64 classes is checked
again with its C and, on the host (CPU backend) or the GPU, 16 n (C - 64) more for the logits and
their gradients: a stray label of 10^9, given as --num-classes, is refused here rather than in an
allocation.

Generated presets add their generator's temporaries (the graph twice while drawing). Checked
against the peak RSS `/usr/bin/time -f %M` measured for `python -m mgg.train --dataset D --epochs 3
--backend cpu` (2-core box, P = 1, defaults GCN 2x16): karate 347 MiB measured / 358 estimated,
sbm 372 / 383, products-like@0.05 (122K nodes, 3.1M edges) 1,080 / 1,211, reddit-like@0.05 (11.6K
nodes, 5.7M edges, F = 602) 1,146 / 1,205: the estimate is 1.03-1.12x the measurement. GPU
(peak torch.cuda memory of `bench/e2e.py`'s mgg run, one H100, GCN 2x16): reddit-like 6.4 GiB
measured / 6.8 estimated, papers-like@0.1 13.0 / 23.6 (the fused input projection keeps no F-wide
temporary); the former formula (F-wide activations, 16 n max(F, H) L) said 59 GiB for papers-like@0.1
and refused papers-like@0.3 on an 80 GB GPU (177 GiB; now 70). A run is refused when the ranks of one node need more than what the host has available
(MemAvailable, or the cgroup limit minus usage when lower) or one rank needs more GPU memory than
its GPU has free; `--force` trains anyway. `MGG_MEMORY_AVAILABLE` (bytes) overrides the host
figure (tests).
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

__all__ = ["GraphSize", "MemoryEstimate", "graph_size", "estimate", "host_available", "check_memory",
           "ASSUMED_CLASSES"]

GIB = 2**30
_BASE_HOST = int(0.35 * GIB)
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
    no whole-graph activations (its batches are small), so those terms drop."""
    n_all, e, f = size.nodes, size.edges, max(size.features, 1)
    p = max(1, world_size)
    n = -(-n_all // p)
    width = max(f, hidden)
    if mode == "sampled":
        layers = 0
    if size.mapped and mode == "full":  # indptr and degrees whole; this rank's rows mapped, then copied
        graph = 24 * n_all + 2 * (8 * e // p + n * (4 * f + 19))
    else:
        graph = 24 * e + n_all * (4 * f + 19) * 2
    if size.generated:
        graph *= 2
    # weights, gradients and Adam's two moments (float32) of a stack F -> H -> ... -> C classes
    classes = max(int(classes), 1)
    params = 16 * (f * hidden + hidden * hidden * max(0, layers - 2) + hidden * classes)
    logits = 16 * n * max(0, classes - ASSUMED_CLASSES)  # beyond what the activations term covers
    host = graph + 48 * e // p + _BASE_HOST
    if not gpu:
        host += 16 * n * width * layers + 4 * n * f + params + logits
    gpu_bytes = (48 * e // p + 12 * n * f + 16 * n * hidden * layers + params + logits + _BASE_GPU
                 if gpu else 0)
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
        return (f"not enough host memory for {what} on {world_size} rank(s): about {_gib(need)} needed "
                f"on this node ({_gib(est.host_per_rank)} per rank x {ranks_on_node}), {_gib(have)} available; "
                f"use more nodes, a smaller --scale or --hidden{fewer}, or --force to try anyway")
    if gpu and gpu_free is not None and est.gpu_per_rank > gpu_free:
        return (f"not enough GPU memory for {what} on {world_size} GPU(s): about {_gib(est.gpu_per_rank)} "
                f"per GPU needed, {_gib(gpu_free)} free; use more GPUs, a smaller --hidden{fewer}, or --force")
    return ""
