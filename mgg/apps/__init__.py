"""mgg.apps: the training application behind `python -m mgg.train` (console script `mgg-train`).

    config.py   TrainConfig, TrainResult, UserError, the CLI's names (backends, variants, modes)
    cli.py      flags -> TrainConfig, load, train (dispatch full/sampled), run, main, exit together
    loop.py     the epoch skeleton both loops share (DistGraph session, local data, one all-reduce
                per epoch, progress, untimed sections, tuning summary)
    full.py     full-graph training: resume, checkpoints, the runtime tuner, fault injection
    sampled.py  --mode sampled: mini-batch training on the same skeleton
    faults.py   MGG_FAULT_INJECT (test hook of the reliability tests)
    report.py   the metrics JSON and the summary lines
    kernel_prebuild.py  the CUDA kernels a GPU run loads, built in parallel before its first epoch
    outputs.py  the files a run writes at its end (metrics, checkpoints), checked before it starts

Models and what they support (--tune, --mode sampled) come from mgg.nn.registry; features,
labels and masks from mgg.data.prepare_graph. full.py and sampled.py do not import each other.
"""
from .config import TrainConfig, TrainResult, UserError

__all__ = ["TrainConfig", "TrainResult", "UserError", "main", "run", "train", "parse_args"]


def __getattr__(name: str):
    """main/run/train/parse_args from cli.py, imported on first use."""
    if name in ("main", "run", "train", "parse_args"):
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
