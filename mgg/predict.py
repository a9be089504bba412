"""`[mpirun -np P] python -m mgg.predict --dataset FILE --weights W --out preds.npz`: per-node
predictions (and, with --embeddings, the last hidden layer) of saved weights on a graph.

W: a weights file of `mgg.train --save-weights` / `python -m mgg.export` (PyG's parameter names,
mgg.apps.weights_file) or an mgg checkpoint. The model runs in evaluation mode over the whole
graph, on the ranks' partitions as in training; rank 0 writes OUT atomically::

    node_id     int64 [N]      0..N-1: row i is node i of FILE
    pred        int64 [N]      argmax of the logits
    logits      float32 [N, C]
    embeddings  float32 [N, H] the input of the last layer (with --embeddings; needs >= 2 layers)

Rows are in the user's node ids: a FILE relabelled by `mgg.prepare` carries `user_ids` (the
input's id of every node), and the rows are put back in the input's order (row i = input node i). Exit 2 with one line on bad input, on every rank.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .apps.common_settings import (DEFAULT_SCALE, DEFAULT_SEED, backend_setting, force_setting, scale_setting,
                                   seed_setting, undirected_setting)
from .apps.flag_spec import REQUIRED, Flag, add_flags, parse_settings, setting

__all__ = ["main", "build_parser", "predict", "PredictSettings"]


@dataclass(frozen=True, kw_only=True)
class PredictSettings:
    """The settings of `python -m mgg.predict`, each field with the flag that sets it
    (mgg.apps.flag_spec: the parser is built from these fields)."""

    dataset: str = setting(REQUIRED, Flag(
        "--dataset", help="the graph: a file or folder mgg.train reads, or a preset name"))
    weights: str = setting(REQUIRED, Flag(
        "--weights", help="weights (.pt with its .json, .safetensors) or an mgg checkpoint"))
    out: str = setting(REQUIRED, Flag("--out", help="the .npz to write (rank 0)"))
    embeddings: bool = setting(False, Flag("--embeddings", action="store_true",
                                           help="also write the last hidden layer's output"))
    undirected: bool = undirected_setting(help="symmetrise the graph as it is loaded (as in training)")
    scale: float = scale_setting(help="presets: size factor (as in training)")
    seed: int = seed_setting(help="presets: generator seed (as in training)")
    backend: str = backend_setting(help="where the model runs")
    force: bool = force_setting(help="overwrite --out if it exists (still atomically)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.predict", description=__doc__.split("\n\n")[0])
    add_flags(p, PredictSettings)
    return p


def _model(desc: dict, sd: dict, num_features: int):
    from .apps.weights_file import WeightsError
    from .nn import build_model

    if desc["num_features"] != num_features:
        raise WeightsError(f"the weights take {desc['num_features']} input features, the graph has {num_features}")
    opts = {"norm": desc.get("norm")} if desc["model"] == "gin" else {}
    model = build_model(desc["model"], num_features, desc["hidden"], desc["num_classes"], desc["layers"],
                        desc.get("dropout", 0.0), **opts)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise WeightsError(f"the weights do not fit a {desc['model']} model: {' '.join(first[:2])}") from None
    return model.eval()


def predict(dataset: str, weights: str, comm, embeddings: bool = False, undirected: bool = False,
            scale: float = DEFAULT_SCALE, seed: int = DEFAULT_SEED, backend: str = "auto") -> dict | None:
    """{"node_id", "pred", "logits"[, "embeddings"]} in the user's node ids on rank 0 (None on
    the others). Collective."""
    import torch

    from .apps.weights_file import read_weights
    from .data import load_dataset
    from .graph import DistGraph, RuntimeConfig
    from .runtime.transfer import host_to_device

    sd, desc = read_weights(weights)
    graph = load_dataset(dataset, scale=scale, seed=seed, mmap=False, to_undirected=undirected)
    if graph.x is None:
        raise ValueError(f"dataset {dataset!r} has no node features (x); the model needs them")
    model = _model(desc, sd, int(graph.x.shape[1]))
    if embeddings and len(model.convs) < 2:
        raise ValueError("--embeddings needs a model of at least 2 layers (the last hidden layer's output)")
    with DistGraph.build(graph, comm, RuntimeConfig(backend=backend)) as dg:
        model = model.to(dg.device)
        x = host_to_device(np.ascontiguousarray(graph.x[dg.lo:dg.hi]), dg.device)
        with torch.no_grad():
            logits = model(x, dg).float().cpu().numpy()
            hidden = None
            if embeddings:
                convs = model.convs
                model.convs = torch.nn.ModuleList(list(convs)[:-1])  # the same modules, the last left out
                try:
                    hidden = model.activation(model(x, dg)).float().cpu().numpy()
                finally:
                    model.convs = convs
    parts = comm.allgather((logits, hidden))
    if comm.rank != 0:
        return None
    out = {"logits": np.concatenate([p[0] for p in parts])}
    if embeddings:
        out["embeddings"] = np.concatenate([p[1] for p in parts])
    perm = getattr(graph, "user_ids", None)
    if perm is not None:  # rows back in the user's ids: perm[new] = the input's id of node new
        perm = np.asarray(perm)
        for k, v in out.items():
            back = np.empty_like(v)
            back[perm] = v
            out[k] = back
    out["pred"] = out["logits"].argmax(axis=1).astype(np.int64)
    out["node_id"] = np.arange(out["logits"].shape[0], dtype=np.int64)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0, exits 2 with one line on bad input (on every rank)."""
    ns = parse_settings(build_parser(), PredictSettings, argv)
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    from .atomic import atomic_write
    from .runtime import world

    comm = world()
    err = None
    out = None
    try:
        if os.path.exists(ns.out) and not ns.force:
            raise ValueError(f"{ns.out} exists; pass --force to replace it (nothing was written)")
        out = predict(ns.dataset, ns.weights, comm, ns.embeddings, ns.undirected, ns.scale, ns.seed, ns.backend)
    except (ValueError, OSError, LookupError) as e:
        err = e
    errs = comm.allgather(None if err is None else str(err))
    bad = next((m for m in errs if m), None)
    if bad is not None:
        sys.stderr.write(f"error: {bad}\n")
        sys.exit(2)
    if comm.rank == 0:
        atomic_write(ns.out, lambda f: np.savez(f, **out))
        what = "pred, logits" + (", embeddings" if ns.embeddings else "")
        print(f"wrote {ns.out}: {what} of {out['logits'].shape[0]:,} nodes")
    return 0


if __name__ == "__main__":
    main()
