"""Models for sampled mini-batch training (blocks from mgg.sample.NeighborLoader).

`SampledSAGE(in_dim, hidden, out_dim, layers, dropout)`: dropout -> SAGEBlockConv -> ReLU per layer
(no ReLU after the last), the same stack as the full-graph `SAGE`. `forward(x, blocks)` maps the
input features of the batch (float32 [U, in_dim], U = blocks[0].n_src) to logits of the seeds
(float32 [B, out_dim], B = blocks[-1].n_dst).

The parameters are laid out exactly as in `mgg.nn.SAGE` (`convs.{i}.lin_l`, `convs.{i}.lin_r`), so
`to_full_graph()` gives a full-graph SAGE with the same weights: mean aggregation over all
neighbors instead of the sampled ones, run by the distributed full-graph aggregation (layer-wise
full-neighborhood inference, the evaluation of the sampled training mode).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .conv.sage_block import SAGEBlockConv
from .models import SAGE, _dims
from .registry import RegistryView, register_sampled_model

__all__ = ["SampledSAGE", "SAMPLED_MODELS", "dropout"]


def dropout(x: torch.Tensor, p: float, training: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Inverted dropout with a uniform-threshold mask (rand >= p): the same distribution as
    F.dropout, about 2x faster on the CPU than its bernoulli_ draw, and seedable per call."""
    if not training or p <= 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class SampledSAGE(nn.Module):
    """GraphSAGE (mean) over sampled blocks; default 2 layers, hidden 64, dropout 0.5."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        super().__init__()
        self.dims = _dims(in_dim, hidden, out_dim, layers)
        self.in_dim, self.hidden, self.out_dim, self.layers = in_dim, hidden, out_dim, layers
        self.convs = nn.ModuleList([SAGEBlockConv(a, b) for a, b in self.dims])
        self.dropout = float(dropout)

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, x: torch.Tensor, blocks: Sequence, generator: torch.Generator | None = None) -> torch.Tensor:
        """x float32 [U, in_dim] -> logits float32 [B, out_dim]; `generator` drives the dropout masks
        (None: torch's default generator; it must live on x's device)."""
        if len(blocks) != len(self.convs):
            raise ValueError(f"SampledSAGE has {len(self.convs)} layers, got {len(blocks)} blocks "
                             f"(one per fanout)")
        last = len(self.convs) - 1
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            x = dropout(x, self.dropout, self.training, generator)
            x = conv(x, block)
            if i < last:
                x = torch.relu(x)
        return x

    def to_full_graph(self) -> SAGE:
        """A full-graph SAGE (mgg.nn.SAGE) holding a copy of these weights, in eval mode."""
        full = SAGE(self.in_dim, self.hidden, self.out_dim, self.layers, self.dropout)
        full.load_state_dict(self.state_dict())
        p = next(self.parameters())
        return full.to(p.device).eval()


register_sampled_model("sage", SampledSAGE)
#: name -> sampled model class, read from the registry (mgg.nn.registry)
SAMPLED_MODELS: RegistryView = RegistryView(lambda e: e.sampled_model, keep=lambda e: e.supports_sampled)
