"""Replay the runtime tuner's search against a saved exhaustive grid, with measurement noise.

    python bench/tune_replay.py bench/results/tune-grid-reddit-like-P2-*.json --noise 0.01 --seeds 50

The grid's latencies (measured on the device by bench/tune_grid.py) stand in for the GPU: every
configuration the search asks for is answered with its grid latency times (1 + noise * N(0, 1)).
Prints the pick / optimum distribution and the number of measurements: how the *current* search
design does on a landscape measured earlier (no GPU needed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.tuning import CrossIterationSearch, DeviceLimits, SearchSpace  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="a tuning log with a 'grid' (bench/tune_grid.py output)")
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--seeds", type=int, default=50)
    args = ap.parse_args(argv)
    with open(args.log) as f:
        d = json.load(f)
    grid = {(g["ps"], g["dist"], g["wpb"], g["variant"]): g["latency_ms"] for g in d["grid"]}
    if not grid:
        raise SystemExit(f"{args.log}: no grid in this log")
    opt = min(grid.values())
    limits = DeviceLimits(**d["limits"])
    variants = tuple(sorted({k[3] for k in grid}))
    ratios, counts = [], []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        s = CrossIterationSearch(int(d["dim"]), limits, SearchSpace(variants=variants))
        while (c := s.next_config()) is not None:
            s.report(c, grid[(c.ps, c.dist, c.wpb, c.variant)] * (1 + args.noise * rng.standard_normal()))
        b = s.best
        ratios.append(grid[(b.ps, b.dist, b.wpb, b.variant)] / opt)
        counts.append(len(s.trials))
    r = np.array(ratios)
    print(f"{os.path.basename(args.log)}: {args.seeds} searches at {args.noise:.1%} noise: pick/optimum median "
          f"{np.median(r):.3f} max {r.max():.3f}, within 5% in {(r <= 1.05).sum()}/{len(r)}; measurements "
          f"median {int(np.median(counts))} max {max(counts)}; (1,1,1)/optimum "
          f"{grid.get((1, 1, 1, variants[0]), float('nan')) / opt:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
