"""The checks of the training command line's flags for what a run leaves behind and how much it
says: weights (--save-weights), per-epoch records (--log-jsonl, --tensorboard) and the verbosity
(-v / -q; the flags themselves are TrainConfig's fields). mgg.apps.args runs them."""
from __future__ import annotations

import argparse
import os

__all__ = ["check_output_args"]


def check_output_args(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """argparse errors (exit 2) for output flags that cannot work: a missing folder, a missing
    package (safetensors, tensorboard)."""
    import importlib.util

    for flag, path in (("--save-weights", ns.save_weights), ("--log-jsonl", ns.log_jsonl)):
        if path:
            d = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(d):
                parser.error(f"{flag} {path}: folder {d} does not exist")
    if ns.save_weights and ns.save_weights.endswith(".safetensors") and importlib.util.find_spec("safetensors") is None:
        parser.error(f"--save-weights {ns.save_weights}: .safetensors needs the safetensors package "
                     f"(pip install safetensors), or name a .pt file")
    if ns.tensorboard:
        from .run_log import tensorboard_problem

        problem = tensorboard_problem()
        if problem:
            parser.error(problem)
    if ns.verbosity < 0:
        ns.progress = False
