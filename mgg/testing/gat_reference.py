"""GAT in dense float64: the ground truth of the GAT tests. A masked softmax over each target's
in-edges, weighted by the multiplicity matrix (duplicate edges count; the graph's self loops are
replaced by exactly one with add_self_loops), multi-head, concat and mean; differentiable by
torch autograd."""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["multiplicity", "dense_attention", "dense_gat_layer"]


def multiplicity(indptr: np.ndarray, indices: np.ndarray, add_self_loops: bool) -> torch.Tensor:
    """float64 [N, N]: entry (i, j) counts the edges j -> i of the CSR (rows = targets); the
    diagonal set to 1 with `add_self_loops`."""
    n = len(indptr) - 1
    tgt = np.repeat(np.arange(n), np.diff(indptr))
    a = np.zeros((n, n))
    np.add.at(a, (tgt, np.asarray(indices)), 1.0)
    if add_self_loops:
        np.fill_diagonal(a, 1.0)  # graph's own self loops replaced by exactly one
    return torch.from_numpy(a)


def dense_attention(A: torch.Tensor, h: torch.Tensor, att_src, att_dst, attention: str = "additive",
                    negative_slope: float = 0.2) -> torch.Tensor:
    """h [N, heads, C] float64 -> out [N, heads, C]: per row i, softmax over edges j (with multiplicity)."""
    if attention == "additive":
        s = (h * att_src).sum(-1)  # [N, H]
        d = (h * att_dst).sum(-1)
        z = d.unsqueeze(1) + s.unsqueeze(0)  # [N(i), N(j), H]
        e = torch.nn.functional.leaky_relu(z, negative_slope)
    else:
        e = torch.einsum("ihc,jhc->ijh", h, h) / math.sqrt(h.shape[-1])
    mask = (A > 0).unsqueeze(-1)
    e = e.masked_fill(~mask, -math.inf)
    m = e.amax(dim=1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(e - m) * A.unsqueeze(-1)
    den = w.sum(dim=1, keepdim=True)
    alpha = w / torch.where(den > 0, den, torch.ones_like(den))
    return torch.einsum("ijh,jhc->ihc", alpha, h)


def dense_gat_layer(conv, x: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """The GATConv `conv` evaluated densely in float64 with its own parameters."""
    W = conv.lin.weight.double()
    h = (x.double() @ W.t()).view(-1, conv.heads, conv.out_channels)
    asrc = None if conv.att_src is None else conv.att_src.double()
    adst = None if conv.att_dst is None else conv.att_dst.double()
    out = dense_attention(A, h, asrc, adst, conv.attention, conv.negative_slope)
    out = out.reshape(-1, conv.heads * conv.out_channels) if conv.concat else out.mean(1)
    if conv.bias is not None:
        out = out + conv.bias.double()
    return out
