"""`python -m mgg.prepare`: write a graph file once, then size it for P ranks.

    python -m mgg.prepare papers-like --scale 1.0 --out papers.npz --ranks 8
    python -m mgg.prepare papers.npz --ranks 2,4,8          # size an existing file

A preset (reddit-like, products-like, papers-like) kept in its generated order is written
straight into the file, chunk by chunk (`mgg.data.generators.save_preset`): the host holds about
50 B per node, never the edges or the features, so papers-like at full size (111M nodes, 1.6B edges, 70 GB on disk) is written on
a host far smaller than the graph. Any other dataset is loaded and saved whole (`save_npz`).
The file is the uncompressed CSR `.npz` that `python -m mgg.train --dataset FILE` memory-maps,
each rank reading only its own rows. An existing file is never overwritten without `--force`;
the write is atomic either way.

`--reorder-nodes` (default auto) writes a graph whose order has no locality in the cluster order
(mgg.apps.node_order; docs/partition.md), with ``user_ids`` (the input's id of every node) in the
file; such a graph is held whole while it is relabelled.

`--ranks P[,P...]` prints, per P, each rank's node range, edges, remote edges and distinct remote
rows, its host bytes, and the symmetric heap every GPU holds per stored width. Exit 2 with one
line on bad input (unknown dataset, a file that exists, a damaged file).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from .common_settings import force_setting, reorder_nodes_setting, scale_setting, seed_setting, undirected_setting
from .flag_spec import REQUIRED, Flag, add_flags, parse_settings, setting

__all__ = ["main", "build_parser", "PrepareSettings"]

_MB = float(1 << 20)
#: host bytes per CSR entry of relabelling a whole graph beyond two copies of it (the label
#: propagation's pattern, counts and scores; METIS's own estimate is
#: mgg.data.metis_order.metis_host_bytes)
_REORDER_BYTES_PER_EDGE = 48


@dataclass(frozen=True, kw_only=True)
class PrepareSettings:
    """What `python -m mgg.prepare` is asked to do, each field with the flag that sets it
    (mgg.apps.flag_spec: the parser is built from these fields)."""

    dataset: str = setting(REQUIRED, Flag(
        "dataset", help="a preset name (reddit-like, products-like, papers-like, sbm, karate) or a graph file"))
    out: str | None = setting(None, Flag("--out", help="the .npz to write (omit to only size an existing .npz)"))
    scale: float = scale_setting(help="presets: nodes and edges x scale, in (0, 1]")
    seed: int = seed_setting(help="generator seed (the same as mgg.train's --seed)")
    device: str = setting("auto", Flag(
        "--device", help="where presets draw their edges and features and where the nodes are relabelled "
                         "(cpu or cuda); auto: presets on cpu (the same file on every machine), a graph file "
                         "relabelled on cuda when a GPU is visible"))
    ranks: str = setting("", Flag("--ranks", help="comma-separated P values to print per-rank sizes for, e.g. 2,4,8"))
    hidden: int = setting(16, Flag("--hidden", type=int, help="hidden width, for the symmetric heap column"))
    reorder_nodes: str = reorder_nodes_setting(
        help="relabel the nodes before writing (docs/partition.md): auto keeps a local input order "
             "and otherwise writes the cluster order when it cuts the remote rows (mgg.apps.node_order; "
             "--device cuda relabels on the GPU); metis needs pymetis; none keeps the input order. A relabelled file "
             "stores user_ids (the input's id of every "
             "node), and training needs no --reorder-nodes. The graph is held whole while it is "
             "relabelled: a preset too large for this host is written in its generated order")
    undirected: bool = undirected_setting(
        help="symmetrise the graph before writing (every edge in both directions, duplicates removed)")
    force: bool = force_setting(help="overwrite --out if it exists (still atomically)")
    dry_run: bool = setting(False, Flag(
        "--dry-run", action="store_true",
        help="presets: draw every edge and feature and size them for --ranks, but write no file "
             "(what a host can generate and partition, without the disk the file needs)"))


class _DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows a flag's default when it is a value: not for a switch (False) or a flag whose
    absence means something else (None, "")."""

    def _get_help_string(self, action):
        d = action.default
        if d is None or d is False or (isinstance(d, str) and d == "") or d is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.prepare", description=__doc__.split("\n\n")[0],
                                formatter_class=_DefaultsShown)
    add_flags(p, PrepareSettings)
    return p


def _ranks(text: str) -> list[int]:
    try:
        ps = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--ranks must be comma-separated positive integers, got {text!r}") from None
    if any(p < 1 for p in ps):
        raise ValueError(f"--ranks must be positive, got {text!r}")
    return ps


def resolved_device(ns: "PrepareSettings") -> str:
    """The device --device names ("auto": cpu for a preset; for a graph file cuda when torch sees
    a GPU, else cpu)."""
    if ns.device != "auto":
        return ns.device
    from ..data.generators import PRESETS

    if ns.dataset.lower() in PRESETS:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_device(name: str) -> None:
    """ValueError for a --device that torch does not know or that this machine lacks."""
    import torch

    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"--device {name!r} is not a device torch knows ({e}); use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA GPU is visible here; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: presets are drawn on cpu or cuda")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _write(ns: PrepareSettings) -> None:
    from ..data.generators import PRESETS, save_preset

    out = ns.out
    if os.path.exists(out) and not ns.force:
        raise ValueError(f"{out} exists; pass --force to replace it (nothing was written)")
    if not out.endswith(".npz"):
        raise ValueError(f"--out must name a .npz file, got {out!r}")
    t0 = time.perf_counter()
    key = ns.dataset.lower()
    method = ns.reorder_nodes
    if key in PRESETS and method == "auto":
        method = _auto_for_preset(ns)
    if method != "none":
        n, e = _write_reordered(ns, method)
    elif key in PRESETS and not ns.undirected:
        say = lambda m: print(f"  writing {m}", flush=True)  # noqa: E731
        n, e = save_preset(key, out, ns.scale, ns.seed, ns.device, progress=say)
    else:
        from ..data import load_dataset
        from ..data.npz import save_npz

        print(f"  loading {ns.dataset}" + (" (symmetrising)" if ns.undirected else ""), flush=True)
        g = load_dataset(ns.dataset, scale=ns.scale, seed=ns.seed, mmap=False, to_undirected=ns.undirected)
        print(f"  loaded {g.num_nodes:,} nodes, {g.num_edges:,} edges in {time.perf_counter() - t0:.1f} s; "
              f"writing {out}", flush=True)
        save_npz(g, out)
        n, e = g.num_nodes, g.num_edges
    dt = time.perf_counter() - t0
    print(f"wrote {out}: {n:,} nodes, {e:,} edges, {os.path.getsize(out) / 2**30:.2f} GiB in {dt:.1f} s "
          f"({e / max(dt, 1e-9) / 1e6:.1f}M edges/s; peak host RSS {_peak_rss_mb():,.0f} MiB)", flush=True)


def _reorder_bytes(num_nodes: int, num_edges: int, num_features: int, method: str) -> int:
    """Host bytes of relabelling a whole graph by `method` (two copies of it plus the order's own)."""
    from ..data.metis_order import metis_host_bytes

    graph = 8 * num_edges + num_nodes * (4 * num_features + 8 + 8 + 3 + 8)
    order = metis_host_bytes(num_nodes, num_edges) if method == "metis" else _REORDER_BYTES_PER_EDGE * num_edges
    return 2 * graph + order


def _auto_for_preset(ns: PrepareSettings) -> str:
    """``auto`` for a generated preset: "auto" when the whole graph can be relabelled on this host
    (its ids are random, so the rule will reorder it), else "none" with a line saying why."""
    from ..data.generators import PRESETS, preset_sizes
    from .memory_check import host_available

    n, e = preset_sizes(ns.dataset.lower(), ns.scale)
    need, free = _reorder_bytes(n, e, PRESETS[ns.dataset.lower()].num_features, "auto"), host_available()
    if need <= free:
        return "auto"
    print(f"node order: none (auto: relabelling {n:,} nodes and {e:,} edges needs about {need / 2**30:.0f} GiB, "
          f"this host has {free / 2**30:.0f} GiB free: the generated order; its ranges read remote rows "
          f"without locality)", flush=True)
    return "none"


def _write_reordered(ns: PrepareSettings, method: str) -> tuple[int, int]:
    """Load (or generate) the dataset whole, relabel it by `method` ("auto": mgg.apps.node_order's
    rule), write it with its user_ids (atomically); returns (nodes, edges)."""
    from ..data import load_dataset
    from ..data.generators import PRESETS
    from ..data.npz import save_npz
    from .node_order import apply_order, choose_order

    t0 = time.perf_counter()
    g = load_dataset(ns.dataset, scale=ns.scale, seed=ns.seed, mmap=False, to_undirected=ns.undirected,
                     device=ns.device if ns.dataset.lower() in PRESETS else None)
    print(f"  loaded {g.num_nodes:,} nodes in {time.perf_counter() - t0:.1f} s"
          + (" (symmetrising)" if ns.undirected else "") + f"; node order {method}", flush=True)
    if method == "auto":
        g, choice = choose_order(g, device=ns.device)
    else:
        g, choice = apply_order(g, method, device=ns.device)
    print(choice.line, flush=True)
    save_npz(g, ns.out)
    return g.num_nodes, g.num_edges


def _dry_run(ns: PrepareSettings, ps: list[int]) -> None:
    """Draw a preset chunk by chunk (edges and features), size it for every P, keep nothing."""
    from ..data.generators import PRESETS, preset_parts
    from ..runtime.footprint import footprints_from_chunks

    if ns.dataset.lower() not in PRESETS:
        raise ValueError(f"--dry-run draws a preset ({', '.join(PRESETS)}), not {ns.dataset!r}")
    t0 = time.perf_counter()
    parts, name = preset_parts(ns.dataset.lower(), ns.scale, ns.seed, ns.device)
    fps = footprints_from_chunks(parts.indptr, parts.source_chunks(), ps, num_features=parts.num_features)
    t_edges = time.perf_counter() - t0
    rows = sum(r1 - r0 for r0, r1, _ in parts.feature_chunks())
    dt = time.perf_counter() - t0
    print(f"drew {name}: {parts.num_nodes:,} nodes, {parts.num_edges:,} edges ({t_edges:.1f} s, "
          f"{parts.num_edges / max(t_edges, 1e-9) / 1e6:.1f}M edges/s), {rows:,} feature rows of {parts.num_features} "
          f"in {dt:.1f} s; peak host RSS {_peak_rss_mb():,.0f} MiB; nothing written (a file would take "
          f"{(8 * parts.num_edges + parts.num_nodes * (4 * parts.num_features + 27)) / 2**30:.1f} GiB)", flush=True)
    for p in ps:
        _print_table(name, parts.num_nodes, parts.num_edges, parts.num_features, p, fps[p], ns.hidden, dt)


def _print_sizes(path: str, ps: list[int], hidden: int) -> None:
    from ..data.npz import load_npz
    from ..runtime.footprint import rank_footprints

    g = load_npz(path, mmap=True)
    f = 0 if g.x is None else int(g.x.shape[1])
    for p in ps:
        t0 = time.perf_counter()
        fps = rank_footprints(g.indptr, g.indices, p, num_features=f)
        _print_table(path, g.num_nodes, g.num_edges, f, p, fps, hidden, time.perf_counter() - t0)
        print(training_estimate(path, p, hidden, g), flush=True)


def file_classes(graph) -> int:
    """The classes `python -m mgg.train` trains for `graph`'s labels (max label + 1, by the same
    rule and shares: mgg.data.labels), or the estimate's assumption when it has none or they
    would be refused."""
    from ..data.labels import num_classes_of, share_bounds, summarize_share
    from ..data.rows import read_rows
    from .memory_check import ASSUMED_CLASSES

    y = getattr(graph, "y", None)
    if y is None:
        return ASSUMED_CLASSES
    parts = max(1, -(-len(y) // (1 << 24)))  # shares of at most 16M labels
    shares = [summarize_share(read_rows(y, *share_bounds(len(y), r, parts)), share_bounds(len(y), r, parts)[0])
              for r in range(parts)]
    try:
        return num_classes_of(shares)
    except ValueError:
        return ASSUMED_CLASSES


def training_estimate(path: str, world_size: int, hidden: int, graph=None) -> str:
    """mgg.apps.memory_check's estimate of `python -m mgg.train --dataset path` on `world_size`
    ranks of one node (this machine's backend, the default model's layers, --hidden `hidden`,
    the file's classes): the figure mgg.train checks before it trains."""
    from ..graph.backends import resolve_backend
    from .config import TrainConfig
    from .memory_check import estimate, estimate_line, graph_size

    size = graph_size(path)
    if size is None:
        return "mgg.train estimate: not known for this file"
    if graph is None:
        from ..data.npz import load_npz

        graph = load_npz(path, mmap=True)
    classes = file_classes(graph)
    layers = int(TrainConfig().resolved().layers)
    gpu = resolve_backend("auto") == "gpu"
    est = estimate(size, hidden, layers, world_size, gpu, "full", classes)
    return estimate_line(size, est, world_size, hidden, layers, classes, gpu)


def _print_table(what: str, num_nodes: int, num_edges: int, f: int, p: int, fps, hidden: int, seconds: float) -> None:
    """One P's per-rank table and the largest rank's line."""
    print(f"\n{what} on P={p} ranks ({num_nodes:,} nodes, {num_edges:,} edges, F={f}; sized in "
          f"{seconds:.1f} s)")
    print(f"{'rank':>4} {'nodes [lo, hi)':>28} {'edges':>14} {'remote edges':>14} {'remote rows':>12} "
          f"{'host MiB':>10} {'heap MiB F':>11} {'heap MiB H':>11}")
    for fp in fps:
        print(f"{fp.rank:>4} {f'{fp.nodes:,} [{fp.lo:,}, {fp.hi:,})':>28} {fp.edges:>14,} {fp.remote_edges:>14,} "
              f"{fp.remote_rows:>12,} {fp.host_bytes / _MB:>10,.0f} {fp.heap_bytes(max(f, 1)) / _MB:>11,.0f} "
              f"{fp.heap_bytes(hidden) / _MB:>11,.0f}")
    big = max(fps, key=lambda r: r.host_bytes)
    print(f"largest rank: {big.nodes:,} nodes ({big.nodes * p / max(1, num_nodes):.2f}x N/P), "
          f"{big.edges:,} edges ({big.edges * p / max(1, num_edges):.2f}x E/P); heap per GPU per stored "
          f"width: F={f}: {big.heap_bytes(max(f, 1)) / _MB:,.0f} MiB, H={hidden}: {big.heap_bytes(hidden) / _MB:,.0f} MiB")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0, exits 2 with one line on bad input."""
    ns = parse_settings(build_parser(), PrepareSettings, argv)
    try:
        ps = _ranks(ns.ranks)
        if not (0 < ns.scale <= 1):
            raise ValueError(f"--scale must be in (0, 1], got {ns.scale}")
        if ns.device != "auto":
            _check_device(ns.device)
        ns = dataclasses.replace(ns, device=resolved_device(ns))
        if ns.dry_run:
            if ns.out is not None:
                raise ValueError("--dry-run writes nothing: leave out --out")
            _dry_run(ns, ps or [1])
            return 0
        if ns.out is None and not ps:
            raise ValueError("nothing to do: give --out FILE.npz to write, and/or --ranks P to size a .npz")
        if ns.out is not None:
            _write(ns)
        if ps:
            path = ns.out or ns.dataset
            if not (path.endswith(".npz") and os.path.isfile(path)):
                raise ValueError(f"--ranks sizes a .npz file; {path!r} is not one (give --out to write it first)")
            _print_sizes(path, ps, ns.hidden)
    except (ValueError, OSError, LookupError) as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(2)
    return 0
