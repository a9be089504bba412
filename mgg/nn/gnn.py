"""GNN: a stack of graph convolutions over a DistGraph, and the fusions between its layers.

Every model maps float32 [n_local, in_dim] features to float32 [n_local, out_dim] logits for this
rank's nodes; `forward(x, dg, generator)` takes the DistGraph and the dropout generator (see
`global_dropout`: seed it identically on every rank). The layers are GraphConvs
(mgg.nn.conv.base): the stack asks each conv's hooks what it may fuse (the input cache, the
dropout inside the projection, the gcn column factor folded into the producer of the input, the
epilogue after the aggregation, the ReLU inside the last GEMM, row sets) and never its type.
The models built on it and their registry: mgg.nn.models.
"""
from __future__ import annotations

import torch
from torch import nn

from .conv.base import GraphConv
from .dense import dropout_project, fused_input_projection
from .epilogue import Epilogue
from .functional import draw_seed, global_dropout, seeded_dropout
from .input_cache import InputAggregationCache

__all__ = ["GNN"]


class GNN(nn.Module):
    """A stack of convolutions: dropout -> conv -> activation, none after the last conv. Each conv
    is a GraphConv (mgg.nn.conv.base); what its hooks declare, the stack fuses: a conv with
    `takes_relu_out` (GINConv) applies the ReLU activation itself (`relu_out=True`: in its last
    GEMM's epilogue), and so on (the attributes below).

    Attributes:
        cache_input_aggregation: when True (default), a first conv whose `input_aggregation()`
            is not None starts, in every forward without input dropout (dropout 0, or
            eval) on an input that needs no gradient, from its aggregation of the input computed
            once (mgg.nn.input_cache): no first-layer aggregation per step. Set False to always
            aggregate (e.g. when the extra [n_local, in_dim] float32 tensor does not fit).
        fold_input_scale: when True (default), a conv that takes a scaled input (its
            `input_scale(dg)` is not None: GCNConv, where the graph takes it natively, csr_rows
            / halo_csr on every rank, float32 or bf16 storage) gets its input from the dropout
            (or the fused dropout-projection) already multiplied by that factor (the gcn column
            factor): no pre-scale pass in the aggregation.
            False: the dropout writes plain rows and the aggregation scales them (the same
            values within float32 rounding).
        fuse_epilogue: when True (default), a hidden conv that `takes_epilogue` (GCNConv,
            SAGEConv) runs its bias, the ReLU and the next layer's input dropout (and input
            scale) as one `Epilogue` (mgg.nn.epilogue): one pass each way on the GPU instead of
            five, and (GCN) no pre-scale pass in its backward aggregation. False: each runs on
            its own (the same values within float32 rounding; the bias gradient summed in
            another order).
        input_dropout: when True (default), the dropout also runs on the input features, before
            the first conv (Kipf & Welling's GCN); False: only between layers (PyG's BasicGNN
            models, mgg's GIN).
    """

    activation = staticmethod(torch.relu)

    def __init__(self, convs: list[GraphConv], dropout: float):
        super().__init__()
        if not convs:
            raise ValueError("a model needs at least one layer")
        for c in convs:
            if not isinstance(c, GraphConv):
                raise TypeError(f"GNN: every layer is a GraphConv (mgg.nn.conv.base), got {type(c).__name__}")
        self.convs = nn.ModuleList(convs)
        self.dropout = float(dropout)
        self.cache_input_aggregation = True
        self.fold_input_scale = True
        self.fuse_epilogue = True
        self.input_dropout = True
        self.input_cache = InputAggregationCache()

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, x: torch.Tensor, dg, generator: torch.Generator | None = None,
                rows=None) -> torch.Tensor:
        """x: float32 [n_local, in_dim] -> logits float32 [n_local, out_dim]. Collective.

        rows: a RowSet registered on dg (mgg.runtime.rowset): the logits of those rows only,
        float32 [len(rows), out_dim], in `rows.index` order; or one entry per layer (RowSet or
        None), the last one those rows, e.g. DistGraph.register_layer_rows: layer l then
        computes only its rows (each set holding the next one's and their in-neighbours), for
        the layers from which on every conv `supports_rows` (no batch norm across rows). The
        values of the rows returned are those of the full forward.
        """
        last = len(self.convs) - 1
        per_layer = list(rows) if isinstance(rows, (list, tuple)) else [None] * last + [rows]
        if len(per_layer) != len(self.convs):
            raise ValueError(f"rows: {len(per_layer)} entries for {len(self.convs)} layers")
        restrictable = len(self.convs)  # the first layer from which on every conv takes rows
        while restrictable > 0 and self.convs[restrictable - 1].supports_rows:
            restrictable -= 1
        layer_rows = [per_layer[i] if (i == last or i >= restrictable) else None for i in range(len(self.convs))]
        # the last conv without row support computes every row, then the rows are sliced; one
        # that `supports_output_rows` (GINConv with batch norm) takes them itself
        sliced = [i == last and layer_rows[i] is not None and i < restrictable
                  and not conv.supports_output_rows for i, conv in enumerate(self.convs)]
        # a dropout runs before every conv, the first one's only with input_dropout (p >= 1
        # zeroes its input without a draw)
        drop = self.training and 0.0 < self.dropout < 1.0
        carried = None  # the Epilogue that ran this layer's input dropout (or scale) in the previous conv
        for i, conv in enumerate(self.convs):
            r = layer_rows[i]
            kw = {} if r is None else {"rows": r, "compact": i == last}
            # the activation inside the conv where it can run it in a GEMM's epilogue
            act_inside = i < last and self.activation is torch.relu and conv.takes_relu_out
            if act_inside:
                kw["relu_out"] = True
            cached = self._cached_input(conv, x, dg) if i == 0 else None
            # the conv's gcn column factor folded into the dropout (or dropout-projection) pass
            if carried is not None:
                scale = carried.row_scale
            else:
                scale = None if (cached is not None or sliced[i]) else self._input_scale(conv, x, dg)
            if scale is not None:
                kw["input_scale"] = scale
            # this layer's dropout seed, then the next one's (the epilogue's): the order of draws
            # global_dropout makes layer by layer
            seed = draw_seed(generator) if (drop and cached is None and carried is None
                                            and (i > 0 or self.input_dropout)) else None
            epi = self._epilogue(i, conv, x, dg, generator, drop, sliced)
            if epi is not None:
                kw["epilogue"] = epi
            if cached is not None:  # the first layer from its input's aggregation, computed once
                if sliced[i]:
                    x = conv.forward_aggregated(cached, x, dg)[r.index]
                else:
                    x = conv.forward_aggregated(cached, x, dg, **kw)
            elif carried is not None:  # dropped (and scaled) by the previous conv's epilogue
                x = conv(x, dg)[r.index] if sliced[i] else conv(x, dg, **kw)
            elif sliced[i]:  # a conv without rows: all, sliced
                x = conv(self._input_dropout(x, dg, seed, layer=i), dg)[r.index]
            elif seed is not None and self._fuses_input(conv, x):  # dropout inside the projection kernels
                h = dropout_project(x, conv.first_weight, self.dropout, seed, dg.lo, row_scale=scale)
                x = conv.forward_projected(h, dg, **kw)
            else:
                x = conv(self._input_dropout(x, dg, seed, scale, layer=i), dg, **kw)
            if i < last and not act_inside and epi is None:
                x = self.activation(x)
            carried = epi if (epi is not None and (epi.p > 0.0 or epi.row_scale is not None)) else None
        return x

    def _input_dropout(self, x: torch.Tensor, dg, seed, row_scale: torch.Tensor | None = None,
                       layer: int = 1) -> torch.Tensor:
        """Conv `layer`'s input dropout: global_dropout's mask for `seed` (drawn by forward), or,
        without a seed (eval, p = 0, p >= 1, the first layer without `input_dropout`),
        global_dropout itself, which then draws none."""
        if seed is None:
            p = self.dropout if (layer > 0 or self.input_dropout) else 0.0
            return global_dropout(x, p, dg, None, self.training, row_scale=row_scale)
        return seeded_dropout(x, self.dropout, seed, dg.lo, row_scale)

    def _epilogue(self, i: int, conv, x: torch.Tensor, dg, generator, drop: bool,
                  sliced: list[bool]) -> Epilogue | None:
        """What conv i, a hidden layer whose conv `takes_epilogue` (GCNConv, SAGEConv), runs after
        its bias in one fused pass (mgg.nn.epilogue): the ReLU, the next conv's input scale where
        it takes one (`_input_scale`), and, where the next layer drops its input, that dropout
        (its seed drawn now); else None (the activation runs on its own). x: conv i's input (its output has x's
        device and dtype)."""
        if (i == len(self.convs) - 1 or self.activation is not torch.relu or not self.fuse_epilogue
                or not conv.takes_epilogue):
            return None
        scale = None if sliced[i + 1] else self._input_scale(self.convs[i + 1], x, dg, pass_runs=True)
        if drop:
            return Epilogue(self.dropout, draw_seed(generator), int(dg.lo), scale)
        if self.training and self.dropout >= 1.0:  # the next layer zeroes its input itself
            return Epilogue()
        return Epilogue(0.0, None, int(dg.lo), scale)  # no dropout (eval, p = 0): the scale alone

    def _cached_input(self, conv, x: torch.Tensor, dg) -> torch.Tensor | None:
        """The first conv's aggregation of x from `input_cache` (built on a miss, collective), or
        None when it does not apply: caching off, a conv without `input_aggregation()`, input
        dropout in this forward, or an x that needs a gradient. The decision reads only values
        every rank shares (the model, the mode, x's dtype and device type), so all ranks take the
        same path."""
        spec = conv.input_aggregation()
        if (not self.cache_input_aggregation or spec is None or x.requires_grad
                or (self.training and self.dropout > 0.0 and self.input_dropout)
                or (x.is_cuda and x.dtype != torch.float32)):
            return None
        kind, chunk = spec
        return self.input_cache.get(x, dg, kind, chunk)

    def _input_scale(self, conv, x: torch.Tensor, dg, pass_runs: bool = False) -> torch.Tensor | None:
        """`conv.input_scale(dg)`, float32 [n_local], when `conv`'s input should come out of the
        dropout already scaled by it (the conv then skips its pre-scale pass: GCNConv's gcn
        column factor): training with a dropout probability in (0, 1) (so the dropout kernel
        runs anyway; `pass_runs`: a pass that writes the input runs anyway, the previous conv's
        Epilogue), float32 CUDA rows, and a conv that offers one (for GCNConv: a graph whose
        executors take scaled input natively, the same on every rank). Otherwise None."""
        if (not self.fold_input_scale
                or not (pass_runs or (self.training and 0.0 < self.dropout < 1.0))
                or not x.is_cuda or x.dtype != torch.float32):
            return None
        return conv.input_scale(dg)

    def _fuses_input(self, conv, x: torch.Tensor) -> bool:
        """Whether `conv`'s input projection takes x through dropout_project: training with a
        dropout probability in (0, 1), and a conv that applies a weight first (`first_weight`)
        to a tall CUDA input the fused kernels take. (Without dropout cuBLAS's GEMMs are faster
        than the fused kernels: `project`.)"""
        w = conv.first_weight
        return (w is not None and self.training and 0.0 < self.dropout < 1.0
                and fused_input_projection(x, int(w.shape[0])))
