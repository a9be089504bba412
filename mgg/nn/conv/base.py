"""GraphConv: the contract between a graph convolution and the model that stacks it.

mgg.nn.models.GNN runs a stack of convolutions as dropout -> conv -> activation per layer. What it
may fuse into a conv, or skip, each conv declares here -- every hook below has a default that
means "not offered", so a conv that declares nothing runs each step on its own. The hooks follow
the split of PyG's MessagePassing (propagate, and `message_and_aggregate` where a conv fuses
them): the stack asks, the conv answers from its own structure.

    hook                    default  what GNN then does
    supports_rows           False    forward(x, dg, rows=, compact=): only a row set's rows
    supports_output_rows    False    the last layer returns a row set's rows itself
    takes_relu_out          False    forward(..., relu_out=True) instead of the activation
    takes_epilogue          False    forward(..., epilogue=Epilogue): bias, ReLU, the next
                                     layer's dropout and input scale in one pass
    input_aggregation()     None     forward_aggregated(agg, x, dg, ...) from the input's
                                     aggregation, computed once (mgg.nn.input_cache)
    first_weight            None     forward_projected(x W^T, dg, ...) after the input dropout
                                     fused into the projection (mgg.nn.dense.dropout_project)
    input_scale(dg)         None     forward(s * x, dg, input_scale=s): its aggregation's
                                     column factor folded into the op producing its input
    takes_block_dropout     False    (sampled block twins, mgg.nn.sampled.SampledGNN)
                                     forward(x, block, drop=BlockDropout): the input dropout
                                     folded into the block's aggregation (mgg.nn.block_sum)
    takes_indexed_rows      False    (sampled block twins) forward(IndexedRows, block): the
                                     input read from its table through the index
                                     (mgg.nn.indexed_rows); else SampledGNN gathers the rows

Adding a convolution: its module in mgg/nn/conv/ subclassing GraphConv (the hooks it offers),
and its model's registration in mgg/nn/models.py (`register_model`). GNN needs no change.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["GraphConv"]


class GraphConv(nn.Module):
    """A graph convolution over a DistGraph, with the fusion hooks GNN may use (module doc).

    Every forward is collective (every rank calls it in the same order) and maps this rank's node
    rows, float32 [n_local, in] on dg.device, to float32 [n_local, out] (with `rows` and
    `compact`: [len(rows), out], in `rows.index` order). The fusion keywords (`relu_out`,
    `epilogue`, `input_scale`) are passed only to a conv that declares the matching hook.
    """

    #: forward(x, dg, rows=RowSet, compact=bool) computes the rows of the set only (compact: them
    #: alone, else [n_local, out] meaningful at them); a property where it depends on the conv
    supports_rows: bool = False
    #: as the last layer, forward(x, dg, rows=RowSet, compact=True) returns the set's rows even where
    #: `supports_rows` is False (it may compute every row first: GINConv with batch norm)
    supports_output_rows: bool = False
    #: forward(..., relu_out=True) returns relu(out), the activation in its last GEMM's epilogue
    takes_relu_out: bool = False
    #: forward(..., epilogue=Epilogue) returns epilogue(out) (mgg.nn.epilogue: its bias, the ReLU
    #: and the next layer's input dropout and scale in one pass, fused with its aggregation)
    takes_epilogue: bool = False
    #: a block twin's forward(x, block, drop=BlockDropout) applies the layer's input dropout itself,
    #: inside its block aggregation (mgg.nn.block_sum); else SampledGNN drops x first
    takes_block_dropout: bool = False
    #: a block twin's forward takes x as mgg.nn.IndexedRows (rows of a table read through an
    #: index); else SampledGNN materialises them first
    takes_indexed_rows: bool = False

    def forward(self, x: torch.Tensor, dg, rows=None, compact: bool = True, **fusion) -> torch.Tensor:
        """x float32 [n_local, in] -> float32 [n_local, out] (module doc). Collective."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def reset_parameters(self) -> None:
        """Re-initialise the parameters (GNN.reset_parameters calls it on every conv)."""
        raise NotImplementedError(f"{type(self).__name__} defines no reset_parameters")

    def input_aggregation(self) -> tuple[str, int | None] | None:
        """(kind, column block) of the aggregation `forward_aggregated` starts from, or None
        (default) when the conv cannot start from its input's aggregation. kind: a DistGraph
        aggregation kind; block: the column width the input cache aggregates at once (None: all
        columns). GNN then aggregates a constant input once (mgg.nn.input_cache)."""
        return None

    def forward_aggregated(self, agg: torch.Tensor, x: torch.Tensor, dg, rows=None, compact: bool = True,
                           **fusion) -> torch.Tensor:
        """forward given agg, float32 [n_local, in], the `input_aggregation()` of x (float32
        [n_local, in]); only for a conv whose `input_aggregation()` is not None."""
        raise NotImplementedError(f"{type(self).__name__} does not start from an input aggregation")

    @property
    def first_weight(self) -> torch.Tensor | None:
        """The weight, float32 [mid, in], applied to the input before anything else (the conv runs
        `forward_projected(x W^T, ...)`), or None (default): GNN then fuses the input dropout into
        that projection (mgg.nn.dense.dropout_project)."""
        return None

    def forward_projected(self, h: torch.Tensor, dg, rows=None, compact: bool = True,
                          **fusion) -> torch.Tensor:
        """The rest of forward once the input went through `first_weight`: h = x W^T, float32
        [n_local, mid]; only for a conv whose `first_weight` is not None."""
        raise NotImplementedError(f"{type(self).__name__} has no first weight")

    def input_scale(self, dg) -> torch.Tensor | None:
        """The per-row factor s, float32 [n_local] on dg.device, this conv takes already applied
        to its input: forward(s[:, None] * x, dg, input_scale=s) (and forward_projected alike)
        equals forward(x, dg) and saves the pass that would apply it (GCNConv: its aggregation's
        column factor, where dg takes a scaled table natively). None (default): not offered.
        The same answer on every rank; it may be collective (every rank asks alike)."""
        return None
