"""`python -m mgg.export CHECKPOINT OUT`: the weights of an mgg checkpoint as a file PyTorch
Geometric (or plain torch) loads: OUT.pt (``torch.load(OUT, weights_only=True)`` -> a state
dict, its description in OUT.pt.json) or OUT.safetensors. The parameter names are those of
PyG's GCN / GraphSAGE / GAT / GIN (mgg.nn.pyg_keys); the description says which PyG model
takes them and with which arguments (mgg.apps.weights_file). Exit 2 with one line on bad input.

    python -m mgg.export runs/ckpt/checkpoint.mgg gin.pt
    python -c "import torch, torch_geometric.nn.models as M, json; d = json.load(open('gin.pt.json'));
               m = getattr(M, d['pyg']['class'])(**d['pyg']['kwargs']); m.load_state_dict(torch.load('gin.pt'))"
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Sequence

from .apps.common_settings import force_setting
from .apps.flag_spec import REQUIRED, Flag, add_flags, parse_settings, setting

__all__ = ["main", "build_parser", "export", "ExportSettings"]


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """The settings of `python -m mgg.export`, each field with the argument that sets it
    (mgg.apps.flag_spec: the parser is built from these fields)."""

    checkpoint: str = setting(REQUIRED, Flag(
        "checkpoint", help="an mgg checkpoint file (checkpoint.mgg) or a folder holding one"))
    out: str = setting(REQUIRED, Flag(
        "out", help="the weights file to write: *.safetensors, or any other name for torch.save (+ .json)"))
    force: bool = force_setting(help="overwrite OUT if it exists (still atomically)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.export", description=__doc__.split("\n\n")[0])
    add_flags(p, ExportSettings)
    return p


def export(checkpoint: str, out: str, force: bool = False) -> dict:
    """Write the weights of `checkpoint` to `out`; returns their description. ValueError (one
    line) on a missing/damaged checkpoint or an existing `out` without `force`."""
    from .apps.weights_file import read_weights, write_weights
    from .checkpoint import resolve_resume

    if os.path.exists(out) and not force:
        raise ValueError(f"{out} exists; pass --force to replace it (nothing was written)")
    path = resolve_resume(checkpoint, None) if os.path.isdir(checkpoint) else checkpoint
    sd, desc = read_weights(path)
    return write_weights(out, desc["model"], sd, desc)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_settings(build_parser(), ExportSettings, argv)
    try:
        desc = export(ns.checkpoint, ns.out, ns.force)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(2)
    pyg = desc["pyg"]
    args = ", ".join(f"{k}={v!r}" for k, v in pyg["kwargs"].items())
    print(f"wrote {ns.out}: {desc['model']} weights under PyG's names; load them into "
          f"torch_geometric.nn.models.{pyg['class']}({args})" + (f" ({pyg['note']})" if pyg.get("note") else ""))
    return 0


if __name__ == "__main__":
    main()
