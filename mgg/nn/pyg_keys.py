"""mgg model weights <-> the state_dict of PyTorch Geometric's models, both ways, exactly.

GCN, SAGE and GAT keep PyG's names already (``convs.<l>.lin.weight``, ``convs.<l>.bias``,
``convs.<l>.lin_l.weight``, ``convs.<l>.att_src``, ...): their state dicts load into
``torch_geometric.nn.models.GCN`` / ``GraphSAGE`` as they are, and GAT's into PyG's ``GAT`` with
``act="elu"`` whose last convolution has one head (mgg's GAT averages ``out_heads = 1``; PyG's
model class gives its last layer ``heads`` heads). GIN's MLP is a ``Sequential`` here and PyG's
``MLP`` (``lins``, ``norms``) there, and the norm after a hidden convolution lives in the
convolution here (``convs.<l>.norm``) and in the model there (``norms.<l>``):

    mgg                                PyG GIN (norm="batch_norm")
    convs.l.nn.0.weight                convs.l.nn.lins.0.weight   (+ lins.0.bias: see below)
    convs.l.nn.1.<bn>                  convs.l.nn.norms.0.module.<bn>
    convs.l.nn.3.{weight,bias}         convs.l.nn.lins.1.{weight,bias}
    convs.l.norm.<bn>                  norms.l.module.<bn>
    convs.l.eps                        convs.l.eps

mgg's Linears right before a batch norm (the MLP's first; in every layer but the last, its second,
before the norm after the convolution) have no bias (the norm removes it); exported, each gets bias
0 and the same running mean. Imported, a bias b folds into the running mean (running_mean - b):
in evaluation ``bn(W x + b)`` with running mean m is ``bn(W x)`` with m - b, so both directions
give the same outputs. ``norm="layer"`` maps LayerNorm's weight and bias likewise (PyG's
``LayerNorm(mode="node")`` is torch's LayerNorm; its default graph mode is another norm).
"""
from __future__ import annotations

import re

import torch

__all__ = ["to_pyg", "from_pyg", "PYG_MODELS"]

#: mgg model name -> the PyG model class with the same weights (torch_geometric.nn.models)
PYG_MODELS = {"gcn": "GCN", "sage": "GraphSAGE", "gat": "GAT", "gin": "GIN"}

_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _gin_layers(sd: dict) -> list[int]:
    return sorted({int(m.group(1)) for k in sd for m in [re.match(r"convs\.(\d+)\.", k)] if m})


def _norm_wrap(norm: str) -> str:
    """The attribute PyG's norm wrapper keeps torch's module under ('' for LayerNorm)."""
    return "module." if norm == "batch" else ""


def to_pyg(model: str, state_dict: dict, norm: str | None = None) -> dict:
    """mgg state dict of `model` ("gcn" | "sage" | "gat" | "gin") -> the same weights under PyG's
    names (new dict of the same tensors; GIN's missing first bias as zeros). `norm`: GIN's norm
    ("batch" | "layer" | "none"; None: "batch")."""
    if model != "gin":
        return dict(state_dict)
    norm = norm or "batch"
    wrap = _norm_wrap(norm)
    out: dict = {}
    for layer in _gin_layers(state_dict):
        p = f"convs.{layer}."
        mlp = {k[len(p + "nn."):]: v for k, v in state_dict.items() if k.startswith(p + "nn.")}
        idx = sorted({int(k.split(".")[0]) for k in mlp})
        lin0, lin1 = idx[0], idx[-1]
        out[p + "eps"] = state_dict[p + "eps"]
        w0 = mlp[f"{lin0}.weight"]
        out[p + "nn.lins.0.weight"] = w0
        out[p + "nn.lins.0.bias"] = mlp.get(f"{lin0}.bias", torch.zeros(w0.shape[0], dtype=w0.dtype))
        w1 = mlp[f"{lin1}.weight"]
        out[p + "nn.lins.1.weight"] = w1
        out[p + "nn.lins.1.bias"] = mlp.get(f"{lin1}.bias", torch.zeros(w1.shape[0], dtype=w1.dtype))
        if norm != "none":
            for k, v in mlp.items():
                if k.startswith(f"{lin0 + 1}."):
                    out[p + f"nn.norms.0.{wrap}" + k.split(".", 1)[1]] = v
            for k, v in state_dict.items():
                if k.startswith(p + "norm."):
                    out[f"norms.{layer}.{wrap}" + k[len(p + "norm."):]] = v
    return out


def from_pyg(model: str, state_dict: dict, norm: str | None = None, first_bias: bool | None = None) -> dict:
    """The inverse of `to_pyg`: PyG's state dict -> mgg's names. `first_bias`: whether mgg's GIN
    keeps the biases of the Linears before its batch norms (None: as mgg builds it -- only without
    batch norm); a bias dropped before batch norm is folded into that norm's running mean."""
    if model != "gin":
        return dict(state_dict)
    norm = norm or "batch"
    wrap = _norm_wrap(norm)
    keep_bias = (norm != "batch") if first_bias is None else first_bias
    norm_at = {"batch": 1, "layer": 1, "none": None}[norm]
    lin1 = 3 if norm_at is not None else 2
    out: dict = {}
    for layer in _gin_layers(state_dict):
        p = f"convs.{layer}."
        out[p + "eps"] = state_dict[p + "eps"]
        out[p + "nn.0.weight"] = state_dict[p + "nn.lins.0.weight"]
        bias = state_dict[p + "nn.lins.0.bias"]
        if keep_bias:
            out[p + "nn.0.bias"] = bias
        out[p + f"nn.{lin1}.weight"] = state_dict[p + "nn.lins.1.weight"]
        bias1 = state_dict[p + "nn.lins.1.bias"]
        post = f"norms.{layer}.{wrap}"
        # the second Linear feeds the norm after the convolution (all layers but the last)
        keep_bias1 = not (norm == "batch" and any(k.startswith(post) for k in state_dict)) \
            if first_bias is None else first_bias
        if keep_bias1:
            out[p + f"nn.{lin1}.bias"] = bias1
        if norm_at is None:
            continue
        src = p + f"nn.norms.0.{wrap}"
        for k, v in state_dict.items():
            if k.startswith(src):
                name = k[len(src):]
                if name == "running_mean" and not keep_bias:
                    v = v - bias  # bn(Wx + b) with mean m == bn(Wx) with mean m - b
                out[p + f"nn.{norm_at}.{name}"] = v
        for k, v in state_dict.items():
            if k.startswith(post):
                name = k[len(post):]
                if name == "running_mean" and not keep_bias1:
                    v = v - bias1  # as for the first Linear's bias
                out[p + "norm." + name] = v
    return out
