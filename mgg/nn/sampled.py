"""Models for sampled mini-batch training (blocks from mgg.sample.NeighborLoader).

Each is the block twin of a full-graph model (mgg.nn.models): the same stack -- dropout -> conv
-> activation per layer, no activation after the last -- with block convolutions, and the same
parameter names, so `to_full_graph()` gives the full-graph model with these weights (layer-wise
full-neighborhood inference over the distributed graph: the evaluation of the sampled mode).
`forward(x, blocks, generator)` maps the batch's input features (float [U, in_dim],
U = blocks[0].n_src) to the seeds' logits (float [B, out_dim], B = blocks[-1].n_dst).

    SampledSAGE  SAGEBlockConv (PyG SAGEConv, mean)                       -> SAGE
    SampledGCN   GCNBlockConv (DGL GraphConv norm="both" on the block,
                 a self loop per dst node)                                 -> GCN
    SampledGAT   GATBlockConv (PyG GATConv((in, in), out), self loops for
                 the dst nodes), 8 heads x hidden, ELU, last layer averaged -> GAT
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .block_sum import BlockDropout
from .indexed_rows import IndexedRows
from .conv.gat_block import GATBlockConv
from .conv.gcn_block import GCNBlockConv
from .conv.sage_block import SAGEBlockConv
from .models import GAT, GCN, SAGE, _dims, gat_stack
from .registry import RegistryView, register_sampled_model

__all__ = ["SampledGNN", "SampledSAGE", "SampledGCN", "SampledGAT", "SAMPLED_MODELS"]


class SampledGNN(nn.Module):
    """A stack of block convolutions: dropout -> conv -> activation, none after the last.

    Subclasses set `full_model` (the full-graph class) and build `convs`; `full_args` are the
    arguments that build the full-graph twin.
    """

    full_model: type = nn.Module
    activation = staticmethod(torch.relu)

    def __init__(self, convs: list[nn.Module], dropout: float, full_args: tuple):
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.dropout = float(dropout)
        self.full_args = full_args

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, x: torch.Tensor | IndexedRows, blocks: Sequence, generator=None) -> torch.Tensor:
        """x float [U, in_dim] (or IndexedRows: the feature table's rows of the batch, read
        through the index by a conv that `takes_indexed_rows`) -> logits float [B, out_dim]. Each layer's input dropout is the hash
        dropout of mgg.nn.block_sum.BlockDropout, one seed a layer drawn from `generator` (a
        torch.Generator on the CPU or on x's GPU, a DeviceSeeds, or None: torch's default one);
        a conv that takes it (`takes_block_dropout`) folds it into its aggregation."""
        if len(blocks) != len(self.convs):
            raise ValueError(f"{type(self).__name__} has {len(self.convs)} layers, got {len(blocks)} blocks "
                             f"(one per fanout)")
        last = len(self.convs) - 1
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            drop = None
            zero_input = self.training and self.dropout >= 1.0
            if isinstance(x, IndexedRows) and (zero_input or not getattr(conv, "takes_indexed_rows", False)):
                x = x.materialize()
            if zero_input:
                x = torch.zeros_like(x)
            elif self.training and self.dropout > 0.0:
                drop = BlockDropout.draw(self.dropout, generator)
            if getattr(conv, "takes_block_dropout", False):
                x = conv(x, block, drop=drop)
            else:
                x = conv(x if drop is None else drop.apply(x), block)
            if i < last:
                x = self.activation(x)
        return x

    def to_full_graph(self) -> nn.Module:
        """The full-graph twin (`full_model`) holding a copy of these weights, in eval mode."""
        full = self.full_model(*self.full_args)
        full.load_state_dict(self.state_dict())
        p = next(self.parameters())
        return full.to(p.device).eval()


class SampledSAGE(SampledGNN):
    """GraphSAGE (mean) over sampled blocks; default 2 layers, hidden 64, dropout 0.5."""

    full_model = SAGE

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        self.dims = _dims(in_dim, hidden, out_dim, layers)
        super().__init__([SAGEBlockConv(a, b) for a, b in self.dims], dropout,
                         (in_dim, hidden, out_dim, layers, dropout))
        self.in_dim, self.hidden, self.out_dim, self.layers = in_dim, hidden, out_dim, layers


class SampledGCN(SampledGNN):
    """GCN over sampled blocks; default 2 layers, hidden 16, dropout 0.5."""

    full_model = GCN

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        super().__init__([GCNBlockConv(a, b) for a, b in _dims(in_dim, hidden, out_dim, layers)], dropout,
                         (in_dim, hidden, out_dim, layers, dropout))


class SampledGAT(SampledGNN):
    """GAT over sampled blocks (the full-graph `GAT`'s stack: hidden layers of `heads` heads of
    `hidden` channels, concatenated; the last layer `out_heads` heads, averaged; ELU); default 2
    layers, 8 heads x 8, dropout 0.6, no attention dropout."""

    full_model = GAT
    activation = staticmethod(torch.nn.functional.elu)

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.6,
                 heads: int = 8, out_heads: int = 1, att_dropout: float = 0.0):
        convs = gat_stack(GATBlockConv, in_dim, hidden, out_dim, layers, heads, out_heads, att_dropout)
        super().__init__(convs, dropout, (in_dim, hidden, out_dim, layers, dropout, heads, out_heads, att_dropout))


register_sampled_model("sage", SampledSAGE)
register_sampled_model("gcn", SampledGCN)
register_sampled_model("gat", SampledGAT)
#: name -> sampled model class, read from the registry (mgg.nn.registry)
SAMPLED_MODELS: RegistryView = RegistryView(lambda e: e.sampled_model, keep=lambda e: e.supports_sampled)
