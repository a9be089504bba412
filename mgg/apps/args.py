"""The training command line: the parser (its flags are TrainConfig's fields, mgg.apps.config; the
environment variables a run reads in its epilog, mgg.env_vars) and `parse_args` -> TrainConfig
(argparse errors, exit 2, for flags that do not combine). mgg.apps.cli runs what they ask for."""
from __future__ import annotations

import argparse
import os
from typing import Sequence

from ..env_vars import run_env_help
from .args_output import check_output_args
from .config import DEFAULT_FANOUT, SAMPLED_FLAGS, TrainConfig, sampled_models
from .config_file import with_config_file
from .flag_spec import add_flags

__all__ = ["build_parser", "parse_args"]


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are two lines: the error, and where the flags are listed (the
    full usage synopsis runs to 20 lines, which buried the error)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `python -m mgg.train` (--model choices: the model registry)."""
    p = _Parser(
        prog="mgg.train", description="Full-graph GNN training over mgg's distributed aggregation\n"
        "(launch with mpirun -np P; without mpirun it runs as one rank).", epilog=run_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, TrainConfig)
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse CLI flags into a TrainConfig (argparse exits with status 2 on a bad value)."""
    import sys

    parser = build_parser()
    argv = with_config_file(build_parser, sys.argv[1:] if argv is None else argv)
    ns = parser.parse_args(argv)
    check_output_args(parser, ns)
    if ns.resume == "auto" and not ns.checkpoint_dir:
        parser.error("--resume auto needs --checkpoint-dir")
    if ns.checkpoint_every and not ns.checkpoint_dir:
        parser.error("--checkpoint-every needs --checkpoint-dir")
    for flag in ("tune_cache", "tune_log"):
        if getattr(ns, flag) is not None and not ns.tune:
            parser.error(f"--{flag.replace('_', '-')} needs --tune")
    if ns.mode == "sampled":
        _check_sampled_flags(parser, ns)
    else:
        for key, flag in SAMPLED_FLAGS.items():
            if getattr(ns, key) is not None:
                parser.error(f"{flag} needs --mode sampled")
    if ns.model is None:
        ns.model = "sage" if ns.mode == "sampled" else "gcn"
    if ns.scale is not None and os.path.exists(ns.dataset):
        parser.error(f"--scale applies to generated datasets only; {ns.dataset} is a file "
                     f"(drop --scale, or make a smaller file)")
    if ns.scale is not None and ns.dataset.lower() in ("default", "karate"):
        parser.error(f"--scale applies to generated datasets only (sbm and the -like presets); --dataset "
                     f"{ns.dataset} is the fixed 34-node karate club (drop --scale, or pick --dataset sbm)")
    if ns.storage_dtype != "fp32":
        _check_storage_dtype(parser, ns)
    if ns.norm is not None and ns.model != "gin":
        parser.error(f"--norm applies to --model gin only, got --model {ns.model}")
    ns.scale = 1.0 if ns.scale is None else ns.scale
    return TrainConfig(**vars(ns))


def _check_storage_dtype(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """What a 16-bit --storage-dtype does not combine with (argparse error, exit 2): the sampled
    mode, models whose aggregation bypasses the plan (GAT's fused kernels), and GPU variants
    without 16-bit kernels."""
    flag = f"--storage-dtype {ns.storage_dtype}"
    if ns.mode != "full":
        parser.error(f"{flag} applies to --mode full only")
    from ..nn.registry import model_entry

    if model_entry(ns.model).aggregation is None:
        parser.error(f"{flag} is not implemented for --model {ns.model} (its fused aggregation keeps "
                     f"float32 rows); use --storage-dtype fp32")
    if ns.backend == "gpu" and ns.variant != "auto":
        from ..kernels.variants import storage_dtype_problem

        problem = storage_dtype_problem(ns.variant, ns.storage_dtype)
        if problem:
            parser.error(problem)


def _check_sampled_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Flags that --mode sampled does not combine with (argparse error, exit 2)."""
    supported = sampled_models()
    if ns.model is not None and ns.model not in supported:
        parser.error(f"--mode sampled supports --model {', '.join(supported)} only, got --model {ns.model}")
    fanout = ns.fanout if ns.fanout is not None else DEFAULT_FANOUT
    if ns.layers is not None and ns.layers != len(fanout):
        given = "--fanout" if ns.fanout is not None else "the default --fanout"
        parser.error(f"--layers {ns.layers} conflicts with {given} {','.join(map(str, fanout))} "
                     f"({len(fanout)} layers): in --mode sampled the number of layers is the number of "
                     f"fanouts; drop --layers or give {ns.layers} fanouts")
    for key, flag in (("tune", "--tune"), ("checkpoint_dir", "--checkpoint-dir"), ("resume", "--resume"),
                      ("profile_steps", "--profile-steps")):
        if getattr(ns, key):
            parser.error(f"{flag} is not supported with --mode sampled yet")


