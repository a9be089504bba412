"""`python -m mgg.tune`: inspect what the runtime tuner did.

    python -m mgg.tune --report tuning-log.json [--plot out.png | --no-plot]
    python -m mgg.tune --cache tuning-cache.json          # list the cached best configurations

`--report` prints every configuration the tuner tried, in order, with its latency, and writes a
PNG of the search path over the ps x dist grid and the wpb x dist grid (as MGG Fig. 11); with an
exhaustive sweep in the log (bench/tune_grid.py) the heat maps are complete and the report says
how far the tuner's pick is from the grid optimum. The plot needs matplotlib
(`pip install mgg[plot]`); without it the table is still printed.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from .apps.flag_spec import Flag, OneOf, add_flags, parse_settings, setting
from .kernels.variants import DEFAULT_VARIANT

__all__ = ["main", "build_parser", "TuneSettings", "format_table", "plot_log"]


def _cfg(r: dict) -> tuple:
    return (int(r["ps"]), int(r["dist"]), int(r["wpb"]), str(r.get("variant", DEFAULT_VARIANT)),
            r.get("ps_inter"))


def _medians(rows: list[dict]) -> dict[tuple, float]:
    acc: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        acc[_cfg(r)].append(float(r["latency_ms"]))
    return {k: statistics.median(v) for k, v in acc.items()}


def _label(c: tuple) -> str:
    s = f"ps={c[0]} dist={c[1]} wpb={c[2]}"
    if c[4] is not None:
        s += f" ps_inter={c[4]}"
    return f"{s} {c[3]}"


def format_table(log: dict) -> str:
    """The trials of a tuning log as a text table plus a summary."""
    trials = log.get("trials", [])
    best = log.get("best")
    bkey = _cfg(best) if best else None
    lines = []
    key = log.get("key") or {}
    if key:
        lines.append(f"key: graph {key.get('fingerprint')}  P={key.get('world_size')}  D={key.get('dim')}  "
                     f"device {key.get('device')}  kernels {key.get('kernel_version')}")
    lim = log.get("limits") or {}
    if lim:
        lines.append(f"limits: {lim.get('name')}: {lim.get('num_sms')} SMs, "
                     f"{lim.get('smem_per_block_optin')} B smem/block (opt-in), "
                     f"{lim.get('max_threads_per_block')} threads/block")
    if log.get("from_cache"):
        lines.append("from cache: the best configuration was applied with zero search iterations")
    hdr = f"{'step':>4}  {'phase':<8} {'ps':>3} {'dist':>4} {'wpb':>3} {'ps_inter':>8}  {'variant':<15} {'latency_ms':>11}"
    lines += [hdr, "-" * len(hdr)]
    for r in trials:
        c = _cfg(r)
        pi = "-" if c[4] is None else str(c[4])
        mark = " *" if c == bkey else ""
        lines.append(f"{int(r['step']):>4}  {r.get('phase', ''):<8} {c[0]:>3} {c[1]:>4} {c[2]:>3} {pi:>8}  "
                     f"{c[3]:<15} {float(r['latency_ms']):>11.4f}{mark}")
    med = _medians(trials)
    if trials:
        first = _cfg(trials[0])
        lines.append("")
        lines.append(f"{len(trials)} measurements, {len(med)} distinct configurations")
        if bkey in med:
            gain = 1 - med[bkey] / med[first]
            lines.append(f"best: {_label(bkey)}  {med[bkey]:.4f} ms (median)  vs start "
                         f"{_label(first)} {med[first]:.4f} ms: {gain:+.1%} time saved")
    elif best:
        lines.append(f"best: {_label(bkey)}")
    grid = log.get("grid") or []
    if grid:
        gm = _medians(grid)
        gbest = min(gm, key=gm.get)
        lines.append(f"grid sweep: {len(gm)} configurations, optimum {_label(gbest)} {gm[gbest]:.4f} ms")
        if bkey in gm:
            lines.append(f"tuner's pick on the grid: {gm[bkey]:.4f} ms = {gm[bkey] / gm[gbest]:.3f} x the optimum")
        elif bkey is not None:
            lines.append("tuner's pick is not in the grid sweep")
    return "\n".join(lines)


def plot_log(log: dict, out: str) -> None:
    """Fig. 11-style PNG: left ps x dist at the search's starting wpb, right wpb x dist at the
    best ps; cells are latencies (grid sweep when present, else the trials), the dotted line is
    the search path, the triangle/star mark the pick. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    space = log.get("space") or {}
    ps_v = list(space.get("ps_values", [1, 2, 4, 8, 16, 32]))
    dist_v = list(space.get("dist_values", [1, 2, 4, 8, 16]))
    wpb_v = list(space.get("wpb_values", [1, 2, 4, 8, 16]))
    base = (space.get("variants") or [DEFAULT_VARIANT])[0]
    trials = [r for r in log.get("trials", []) if str(r.get("variant", DEFAULT_VARIANT)) == base
              and r.get("ps_inter") is None]
    tmed = _medians(trials)
    gmed = {k: v for k, v in _medians(log.get("grid") or []).items() if k[3] == base and k[4] is None}
    vals = {**tmed, **gmed} if gmed else tmed
    best = log.get("best") or (min(vals, key=vals.get) if vals else None)
    bkey = _cfg(best) if isinstance(best, dict) else best
    if bkey is None:
        raise ValueError("the log has no trials to plot")
    wpb0 = wpb_v[0]

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6), constrained_layout=True)
    finite = [v for v in vals.values() if math.isfinite(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0, 1)
    cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="#e6e6e6")

    def panel(ax, xs, ys, cell, path, pick, xname, title, marker):
        z = np.full((len(ys), len(xs)), np.nan)
        for i, y in enumerate(ys):
            for j, x in enumerate(xs):
                v = cell(x, y)
                if v is not None:
                    z[i, j] = v
        im = ax.imshow(np.ma.masked_invalid(z), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                       aspect="auto")
        for i in range(len(ys)):
            for j in range(len(xs)):
                if not np.isnan(z[i, j]):
                    rgba = im.cmap(im.norm(z[i, j]))
                    dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
                    ax.text(j, i + 0.42, f"{z[i, j]:.3g}", ha="center", va="top", fontsize=7.5,
                            color="white" if dark else "black")
        pts = [(xs.index(x), ys.index(y)) for x, y in path if x in xs and y in ys]
        if pts:
            px, py = zip(*pts)
            ax.plot(px, py, ":", color="black", lw=1.6)
            ax.plot(px, py, "o", color="black", ms=4)
            ax.plot(px[0], py[0], "s", color="white", mec="black", ms=9, label="path start")
        if pick[0] in xs and pick[1] in ys:
            ax.plot(xs.index(pick[0]), ys.index(pick[1]), marker, color="red", mec="black", ms=16,
                    label="searched optimum (E)")
            ax.annotate("E", (xs.index(pick[0]), ys.index(pick[1])), color="white", ha="center",
                        va="center", fontsize=8, fontweight="bold")
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_yticks(range(len(ys)), [str(y) for y in ys])
        ax.set_xlabel(xname)
        ax.set_ylabel("dist")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8,
                  frameon=False)
        return im

    def at(ps, dist, wpb):
        return vals.get((ps, dist, wpb, base, None))

    early = [r for r in trials if r.get("phase") in ("ps", "dist")]
    late = [r for r in trials if int(r["ps"]) == bkey[0] and r.get("phase") not in ("ps", "dist")]
    if not early and trials:
        early = trials[:1]
    im = panel(axes[0], ps_v, dist_v, lambda x, y: at(x, y, wpb0),
               [(int(r["ps"]), int(r["dist"])) for r in early], (bkey[0], bkey[1]), "ps",
               f"latency (ms), ps x dist at wpb={wpb0}", "^")
    late_path = [(int(r["wpb"]), int(r["dist"])) for r in late]
    if late_path and at(bkey[0], bkey[1], wpb0) is not None:
        late_path = [(wpb0, bkey[1])] + late_path
    panel(axes[1], wpb_v, dist_v, lambda x, y: at(bkey[0], y, x), late_path, (bkey[2], bkey[1]),
          "wpb", f"latency (ms), wpb x dist at ps={bkey[0]}", "*")
    fig.colorbar(im, ax=axes, shrink=0.8, fraction=0.04, pad=0.02, label="latency (ms)")
    key = log.get("key") or {}
    src = "grid sweep + search path" if gmed else "measured by the search (grey: not visited)"
    head = f"MGG tuner: {len(log.get('trials', []))} measurements, pick {_label(bkey)}"
    if key:
        head += f"  |  P={key.get('world_size')} D={key.get('dim')} {key.get('device')}"
    others = [(k, v) for k, v in _medians(log.get("trials", [])).items() if k[3] != base]
    if others:
        src += "  |  other variants: " + ", ".join(f"{k[3]} {v:.3g} ms" for k, v in sorted(others))
    fig.suptitle(f"{head}\n{src}", fontsize=11)
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_WHAT = OneOf(required=True)  # --report or --cache


@dataclass(frozen=True)
class TuneSettings:
    """The settings of `python -m mgg.tune`, each field with the flag that sets it
    (mgg.apps.flag_spec: the parser is built from these fields); one of report and cache is given."""

    report: str | None = setting(None, Flag("--report", metavar="PATH", exclusive=_WHAT,
                                            help="a tuning log written by the tuner"))
    cache: str | None = setting(None, Flag("--cache", metavar="PATH", exclusive=_WHAT,
                                           help="a tuning cache: list its entries"))
    plot: str | None = setting(None, Flag("--plot", metavar="PNG",
                                          help="where to write the plot (default: PATH with .png)"))
    no_plot: bool = setting(False, Flag("--no-plot", action="store_true", help="print the table only"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.tune", description=__doc__.split("\n\n")[0])
    add_flags(p, TuneSettings)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_settings(build_parser(), TuneSettings, argv)
    from .tuning.cache import TuningCache, read_log

    if args.cache:
        if not os.path.exists(args.cache):
            print(f"error: {args.cache}: no such file", file=sys.stderr)
            return 2
        cache = TuningCache(args.cache)
        entries = cache.entries()
        if cache.set_aside:
            print(f"error: {args.cache} was unreadable; moved to {cache.set_aside}", file=sys.stderr)
            return 1
        for e in entries:
            k = e.key
            print(f"{k.fingerprint}  P={k.world_size}  D={k.dim}  {k.device}  {k.kernel_version}  "
                  f"{k.extra}\n    -> {e.best.label()}  {e.latency_ms:.4f} ms  ({e.trials} trials, {e.updated})")
        print(f"{len(entries)} entries")
        return 0
    try:
        log = read_log(args.report)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(log))
    if args.no_plot:
        return 0
    if not log.get("trials") and not log.get("grid"):
        print("nothing to plot (no trials)")
        return 0
    if not _have_matplotlib():
        print("plot skipped: matplotlib is not installed (pip install 'mgg[plot]' or pip install matplotlib)")
        return 0
    out = args.plot or os.path.splitext(args.report)[0] + ".png"
    plot_log(log, out)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
