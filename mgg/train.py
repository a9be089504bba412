"""`mpirun -np P python -m mgg.train [flags]`: the entry point of the training app (mgg.apps).

Full-graph node-classification training (and `--mode sampled` mini-batches) over mgg's
distributed aggregation; `--tune` lets the runtime tuner (docs/tuner.md) pick ps/dist/wpb and the
GPU kernel variant. This module re-exports the app's public names; the code lives in mgg/apps/.
"""
from __future__ import annotations

from .apps.cli import build_parser, load, main, parse_args, run, train
from .apps.cli import load as _load  # noqa: F401 - tests load datasets the way the CLI does
from .apps.config import (BACKENDS, DEFAULT_BATCH_SIZE, DEFAULT_FANOUT, DEFAULT_TUNE_CACHE, KNOB_DEFAULTS, MODES,
                          SAMPLED_FLAGS, TUNED_VARIANTS, VARIANTS, TrainConfig, TrainResult, UserError)
from .apps.report import write_metrics
from .data.prepare import PreparedGraph, prepare_graph

__all__ = ["TrainConfig", "TrainResult", "UserError", "parse_args", "build_parser", "prepare_graph",
           "PreparedGraph", "train", "run", "load", "write_metrics", "main", "BACKENDS", "VARIANTS",
           "TUNED_VARIANTS", "KNOB_DEFAULTS", "DEFAULT_TUNE_CACHE", "MODES", "DEFAULT_FANOUT",
           "DEFAULT_BATCH_SIZE", "SAMPLED_FLAGS"]

if __name__ == "__main__":
    main()
