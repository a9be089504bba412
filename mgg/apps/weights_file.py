"""Trained weights as a file other tools read: a plain ``torch.load``-able state dict or a
safetensors file, under PyTorch Geometric's parameter names (mgg.nn.pyg_keys), with a small
JSON description of the model beside it.

    weights.pt           torch.save(state_dict): torch.load(path, weights_only=True) gives the
                         dict that PyG's GCN / GraphSAGE / GAT / GIN load_state_dict takes
    weights.pt.json      {"format": "mgg-weights", "model": "gin", "num_features": F,
                         "num_classes": C, "hidden": H, "layers": L, "norm": ..., "pyg": {...}}
    weights.safetensors  the same tensors (safetensors.torch.load_file), the description in the
                         file's metadata under "mgg" (no second file); needs `pip install safetensors`

Both files are written atomically. `read_weights` gives the state dict back under mgg's names
with the description, for `python -m mgg.predict`; it also takes an mgg checkpoint
(``checkpoint.mgg``, mgg.checkpoint) directly.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..atomic import atomic_path, atomic_write

__all__ = ["WeightsError", "describe", "write_weights", "read_weights", "pyg_constructor"]

FORMAT = "mgg-weights"


class WeightsError(ValueError):
    """A weights file that cannot be written or used; the message names the file."""


def _infer_dims(model: str, sd: dict) -> tuple[int, int]:
    """(num_features, num_classes) from the first and the last layer's weights (mgg names)."""
    layers = sorted({int(k.split(".")[1]) for k in sd if k.startswith("convs.")})
    first, last = f"convs.{layers[0]}.", f"convs.{layers[-1]}."
    if model == "gin":
        w_in = sd[first + "nn.0.weight"]
        lin = max(int(k.split(".")[3]) for k in sd if k.startswith(last + "nn.") and k.endswith(".weight")
                  and sd[k].dim() == 2)
        return int(w_in.shape[1]), int(sd[last + f"nn.{lin}.weight"].shape[0])
    if model == "gat":
        heads = int(sd[last + "att_src"].shape[1])
        return int(sd[first + "lin.weight"].shape[1]), int(sd[last + "lin.weight"].shape[0]) // heads
    if model == "sage":
        return int(sd[first + "lin_l.weight"].shape[1]), int(sd[last + "lin_l.weight"].shape[0])
    return int(sd[first + "lin.weight"].shape[1]), int(sd[last + "lin.weight"].shape[0])


def pyg_constructor(desc: dict) -> dict:
    """How to build the PyG model these weights load into: {"class": "GIN", "kwargs": {...}}
    (torch_geometric.nn.models.<class>(**kwargs)), plus a "note" where the class needs a change."""
    m, f, c, h, L = desc["model"], desc["num_features"], desc["num_classes"], desc["hidden"], desc["layers"]
    from ..nn.pyg_keys import PYG_MODELS

    out: dict[str, Any] = {"class": PYG_MODELS.get(m)}
    if m == "gin":
        norm = {"batch": "batch_norm", "layer": "layer_norm", "none": None}[desc.get("norm") or "batch"]
        kw = {"in_channels": f, "hidden_channels": h, "num_layers": L, "out_channels": c, "norm": norm}
        if norm == "layer_norm":
            kw["norm_kwargs"] = {"mode": "node"}
        out["kwargs"] = kw
    elif m == "gat":
        heads = int(desc.get("heads", 8))
        out["kwargs"] = {"in_channels": f, "hidden_channels": h * heads, "num_layers": L, "out_channels": c,
                         "heads": heads, "act": "elu"}
        out["note"] = (f"replace the last convolution by torch_geometric.nn.GATConv({h * heads if L > 1 else f}, "
                       f"{c}, heads=1, concat=False): mgg's GAT averages one head in its last layer")
    else:
        out["kwargs"] = {"in_channels": f, "hidden_channels": h, "num_layers": L, "out_channels": c}
    return out


def describe(model: str, state_dict: dict, config: dict) -> dict:
    """The JSON description of `state_dict` (mgg names) of a `model` trained with `config` (a
    resolved TrainConfig as a dict)."""
    f, c = _infer_dims(model, state_dict)
    desc = {"format": FORMAT, "model": model, "num_features": f, "num_classes": c,
            "hidden": int(config["hidden"]), "layers": int(config["layers"]), "norm": config.get("norm"),
            "dropout": float(config.get("dropout") or 0.0), "keys": "pyg"}
    if model == "gin" and desc["norm"] is None:
        desc["norm"] = "batch"
    if model == "gat":
        desc["heads"] = int(state_dict["convs.0.att_src"].shape[1])
    desc["pyg"] = pyg_constructor(desc)
    from ..version import version

    desc["mgg_version"] = version()
    return desc


def write_weights(path: str, model: str, state_dict: dict, config: dict) -> dict:
    """Write the weights of `model` (mgg names) under PyG's names to `path` (``.safetensors``:
    safetensors; anything else: torch.save of the dict + ``path.json``). Returns the description."""
    import torch

    from ..nn.pyg_keys import to_pyg

    desc = describe(model, state_dict, config)
    tensors = {k: v.detach().cpu().contiguous() for k, v in to_pyg(model, state_dict, desc["norm"]).items()}
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise WeightsError(f"cannot write weights {path}: folder {d} does not exist")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise WeightsError(f"{path}: writing .safetensors needs the safetensors package (pip install "
                               f"safetensors); or name a .pt file") from None
        atomic_path(path, lambda tmp: save_file(tensors, tmp, metadata={"mgg": json.dumps(desc)}))
        return desc
    atomic_write(path, lambda f: torch.save(tensors, f))
    atomic_write(path + ".json", lambda f: json.dump(desc, f, indent=2), text=True)
    return desc


def read_weights(path: str) -> tuple[dict, dict]:
    """(state dict under mgg's names, description) of a weights file written by `write_weights`,
    or of an mgg checkpoint. WeightsError (one line naming the file) otherwise."""
    from ..nn.pyg_keys import from_pyg

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightsError(f"weights {path}: file not found")
    with open(path, "rb") as f:
        head = f.read(16)
    from ..checkpoint import MAGIC, CheckpointError, read_checkpoint

    if head.startswith(MAGIC):
        try:
            state = read_checkpoint(path)
        except CheckpointError as e:
            raise WeightsError(str(e)) from None
        cfg = state["config"]
        return dict(state["model"]), describe(cfg["model"], state["model"], cfg)
    if path.endswith(".safetensors"):
        try:
            from safetensors import safe_open
        except ImportError:
            raise WeightsError(f"{path}: reading .safetensors needs the safetensors package "
                               f"(pip install safetensors)") from None
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # noqa: BLE001 - any damage is one line naming the file
            raise WeightsError(f"weights {path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
        if "mgg" not in meta:
            raise WeightsError(f"weights {path}: no mgg description in its metadata (not written by mgg)")
        desc = json.loads(meta["mgg"])
    else:
        import torch

        side = path + ".json"
        if not os.path.isfile(side):
            raise WeightsError(f"weights {path}: its description {side} is missing (written beside it by "
                               f"mgg.export / mgg.train --save-weights)")
        try:
            with open(side, encoding="utf-8") as f:
                desc = json.load(f)
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise WeightsError(f"weights {path}: cannot read ({type(e).__name__}: {e})") from None
        if not isinstance(tensors, dict):
            raise WeightsError(f"weights {path}: holds a {type(tensors).__name__}, expected a state dict")
    if desc.get("format") != FORMAT:
        raise WeightsError(f"weights {path}: description format {desc.get('format')!r}, expected {FORMAT!r}")
    return from_pyg(desc["model"], tensors, desc.get("norm")), desc
