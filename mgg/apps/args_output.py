"""The training command line's flags for what a run leaves behind and how much it says: weights
(--save-weights), per-epoch records (--log-jsonl, --tensorboard), the settings of an earlier run
(--config) and the verbosity (-v / -q). mgg.apps.args adds them to the parser."""
from __future__ import annotations

import argparse
import os

__all__ = ["add_output_args", "check_output_args"]


def add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("outputs and run records")
    g.add_argument("--save-weights", default=None, metavar="PATH",
                   help="at the end, write the trained weights under PyTorch Geometric's parameter names "
                   "(rank 0): PATH.safetensors, or torch.save for any other name (torch.load(PATH) gives the "
                   "state dict; its description in PATH.json); read by python -m mgg.predict")
    g.add_argument("--log-jsonl", default=None, metavar="PATH",
                   help="per-epoch records as JSON lines, written as the epochs happen (rank 0; a start "
                   "line with the config, one line an epoch, an end line; appended to with --resume)")
    g.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="per-epoch scalars for TensorBoard (torch.utils.tensorboard; needs pip install tensorboard)")
    g.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="start from the settings of an earlier run: its --metrics-json, its --log-jsonl, or a "
                   "JSON object of settings; flags given here win (output paths are not carried over)")
    v = g.add_mutually_exclusive_group()
    v.add_argument("-v", "--verbose", dest="verbosity", action="count", default=0,
                   help="more messages: -v shows the tuner's and the loaders' debug lines")
    v.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                   help="only warnings, errors and the final summary (no progress, no phase lines)")


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
