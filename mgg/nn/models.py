"""Whole-graph node classification models: GCN, GIN, SAGE, GAT.

Every model maps float32 [n_local, in_dim] features to float32 [n_local, out_dim] logits for this
rank's nodes; `forward(x, dg, generator)` takes the DistGraph and the dropout generator (see
`global_dropout`: seed it identically on every rank).
"""
from __future__ import annotations

import torch
from torch import nn

from .conv import GATConv, GCNConv, GINConv, SAGEConv
from .dense import dropout_project, fused_input_projection
from .epilogue import Epilogue
from .functional import draw_seed, global_dropout, seeded_dropout, takes_scaled_input
from .input_cache import InputAggregationCache
from .registry import ModelDefaults, RegistryView, model_entry, register_model
from .norm import make_norm

__all__ = ["GNN", "GCN", "GIN", "SAGE", "GAT", "ModelDefaults", "MODEL_DEFAULTS", "MODELS", "build_model"]


class GNN(nn.Module):
    """A stack of convolutions: dropout -> conv -> activation, none after the last conv. A conv
    with `takes_relu_out = True` (GINConv) applies a ReLU activation itself (`relu_out=True`:
    in its last GEMM's epilogue).

    Attributes:
        cache_input_aggregation: when True (default), a first conv that offers
            `input_aggregation()` starts, in every forward without input dropout (dropout 0, or
            eval) on an input that needs no gradient, from its aggregation of the input computed
            once (mgg.nn.input_cache): no first-layer aggregation per step. Set False to always
            aggregate (e.g. when the extra [n_local, in_dim] float32 tensor does not fit).
        fold_input_scale: when True (default), a conv that takes a scaled input
            (`scaled_input_kind`, GCNConv) gets its input from the dropout (or the fused
            dropout-projection) already multiplied by the gcn column factor, where the graph
            takes it natively (csr_rows / halo_csr on every rank, float32 or bf16 storage): no
            pre-scale pass in the aggregation.
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

    def __init__(self, convs: list[nn.Module], dropout: float):
        super().__init__()
        if not convs:
            raise ValueError("a model needs at least one layer")
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
        while restrictable > 0 and getattr(self.convs[restrictable - 1], "supports_rows", False):
            restrictable -= 1
        layer_rows = [per_layer[i] if (i == last or i >= restrictable) else None for i in range(len(self.convs))]
        # the last conv without row support computes every row, then the rows are sliced; one
        # that `supports_output_rows` (GINConv with batch norm) takes them itself
        sliced = [i == last and layer_rows[i] is not None and i < restrictable
                  and not getattr(conv, "supports_output_rows", False) for i, conv in enumerate(self.convs)]
        # a dropout runs before every conv, the first one's only with input_dropout (p >= 1
        # zeroes its input without a draw)
        drop = self.training and 0.0 < self.dropout < 1.0
        carried = None  # the Epilogue that ran this layer's input dropout (or scale) in the previous conv
        for i, conv in enumerate(self.convs):
            r = layer_rows[i]
            kw = {} if r is None else {"rows": r, "compact": i == last}
            # the activation inside the conv where it can run it in a GEMM's epilogue
            act_inside = i < last and self.activation is torch.relu and getattr(conv, "takes_relu_out", False)
            if act_inside:
                kw["relu_out"] = True
            cached = self._cached_input(conv, x, dg) if i == 0 else None
            # the conv's gcn column factor folded into the dropout (or dropout-projection) pass
            if carried is not None:
                scale = carried.row_scale
            else:
                scale = None if (cached is not None or sliced[i]) else self._input_scale(conv, x, dg)
            if scale is not None:
                kw["scaled_input"] = True
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
                or not getattr(conv, "takes_epilogue", False)):
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
        spec = getattr(conv, "input_aggregation", None)
        spec = spec() if spec is not None else None
        if (not self.cache_input_aggregation or spec is None or x.requires_grad
                or (self.training and self.dropout > 0.0 and self.input_dropout)
                or (x.is_cuda and x.dtype != torch.float32)):
            return None
        kind, chunk = spec
        return self.input_cache.get(x, dg, kind, chunk)

    def _input_scale(self, conv, x: torch.Tensor, dg, pass_runs: bool = False) -> torch.Tensor | None:
        """dg.gcn_factor() when `conv`'s input should come out of the dropout already scaled by
        it (the conv then skips its pre-scale pass: GCNConv.scaled_input_kind): training with
        a dropout probability in (0, 1) (so the dropout kernel runs anyway; `pass_runs`: a pass
        that writes the input runs anyway, the previous conv's Epilogue), float32 CUDA rows,
        and a graph whose executors take scaled input natively (dg.takes_scaled_input, the same
        on every rank). Otherwise None."""
        kind = getattr(conv, "scaled_input_kind", None)
        if (not self.fold_input_scale or kind is None
                or not (pass_runs or (self.training and 0.0 < self.dropout < 1.0))
                or not x.is_cuda or x.dtype != torch.float32 or not takes_scaled_input(dg, kind)):
            return None
        return dg.gcn_factor()

    def _fuses_input(self, conv, x: torch.Tensor) -> bool:
        """Whether `conv`'s input projection takes x through dropout_project: training with a
        dropout probability in (0, 1), and a conv that applies a weight first (`first_weight`)
        to a tall CUDA input the fused kernels take. (Without dropout cuBLAS's GEMMs are faster
        than the fused kernels: `project`.)"""
        w = getattr(conv, "first_weight", None)
        return (w is not None and self.training and 0.0 < self.dropout < 1.0
                and fused_input_projection(x, int(w.shape[0])))


def _dims(in_dim: int, hidden: int, out_dim: int, layers: int) -> list[tuple[int, int]]:
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
    return list(zip(widths[:-1], widths[1:]))


class GCN(GNN):
    """Kipf & Welling GCN (default: 2 layers, hidden 16, dropout 0.5)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        super().__init__([GCNConv(a, b) for a, b in _dims(in_dim, hidden, out_dim, layers)], dropout)


class GIN(GNN):
    """GIN as PyG's `torch_geometric.nn.models.GIN` builds it (default: 5 layers, hidden 64, GIN-0
    with batch norm: fixed eps = 0). Layer l, of output width w (hidden; the last: the classes):

        GINConv(MLP: Linear(in, w) - norm(w) - ReLU - Linear(w, w)) - [norm(w) - ReLU - dropout]

    the bracket on every layer but the last: the norm inside each MLP and again after each hidden
    convolution, the dropout between layers only (none on the input features). Without a norm
    the 5 sum aggregations grow the activations ~11x per layer on sbm (avg degree 10) and GIN
    trains far worse than GCN; the norm after the convolution is what keeps the next layer's
    input at unit scale (bench/gin_accuracy.py and docs/models.md measure both forms against
    PyG's GIN). eps is fixed (GIN-0, as Xu et al. recommend and PyG defaults to): it trains as
    well. (The P-rank vs 1-rank weight gap of GIN is float32 rounding of a different summation
    order that Adam amplifies where a gradient element is near 0, so it depends on chance; in
    float64 the gap is 2e-12.)

    The weights are PyG's GIN's up to names and the biases of Linears right before a batch norm
    (mgg.export maps them): with batch norm, the MLP's first Linear and, in every layer but the
    last, its second have no bias here, since the norm removes it (its gradient is 0 up to
    rounding, which Adam would turn into +-lr steps that differ between P ranks and 1).

    Args:
        norm: normalisation in every MLP and after every hidden convolution: "batch"
            (DistBatchNorm, statistics over all ranks), "layer" (LayerNorm) or "none".
        eps: initial epsilon. train_eps: learn it.
        post_norm: False leaves out the norm after each hidden convolution (one norm per layer,
            inside the MLP; for comparisons).
        input_dropout: True also drops the input features before the first convolution.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 5, dropout: float = 0.5,
                 norm: str = "batch", eps: float = 0.0, train_eps: bool = False, post_norm: bool = True,
                 input_dropout: bool = False):
        dims = _dims(in_dim, hidden, out_dim, layers)
        convs = []
        for i, (a, b) in enumerate(dims):
            after = make_norm(norm, b) if (post_norm and i < len(dims) - 1) else None
            # a Linear right before batch norm has no bias (the norm removes it; see above)
            last_bias = not (norm == "batch" and after is not None)
            stages = [nn.Linear(a, b, bias=norm != "batch"), make_norm(norm, b), nn.ReLU(),
                      nn.Linear(b, b, bias=last_bias)]
            mlp = nn.Sequential(*[m for m in stages if m is not None])
            convs.append(GINConv(mlp, eps=eps, train_eps=train_eps, norm=after))
        super().__init__(convs, dropout)
        self.norm = norm
        self.input_dropout = bool(input_dropout)


class SAGE(GNN):
    """GraphSAGE with the mean aggregator (default: 2 layers, hidden 64)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        super().__init__([SAGEConv(a, b) for a, b in _dims(in_dim, hidden, out_dim, layers)], dropout)


class GAT(GNN):
    """GAT (Velickovic et al.; default: 2 layers, 8 heads x 8 hidden, ELU, dropout 0.6).

    `hidden` is the width per head: hidden layers output heads * hidden (heads concatenated); the
    last layer has `out_heads` heads, averaged. Attention dropout (`att_dropout`, the paper's 0.6)
    defaults to 0 here: its mask is drawn per rank, so P ranks would not reproduce a 1-rank run.
    """

    activation = staticmethod(torch.nn.functional.elu)  # the GAT paper's activation

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.6,
                 heads: int = 8, out_heads: int = 1, att_dropout: float = 0.0):
        super().__init__(gat_stack(GATConv, in_dim, hidden, out_dim, layers, heads, out_heads, att_dropout), dropout)


def gat_stack(conv, in_dim: int, hidden: int, out_dim: int, layers: int, heads: int, out_heads: int,
              att_dropout: float) -> list:
    """GAT's layers of class `conv` (GATConv, or a block twin with its signature): `layers - 1`
    hidden layers of `heads` heads of `hidden` channels, concatenated, then `out_heads` heads of
    `out_dim`, averaged."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    convs, width = [], in_dim
    for _ in range(layers - 1):
        convs.append(conv(width, hidden, heads=heads, dropout=att_dropout))
        width = heads * hidden
    convs.append(conv(width, out_dim, heads=out_heads, concat=False, dropout=att_dropout))
    return convs


# -- the registry (mgg.nn.registry): one call per model -----------------------------------------
register_model("gcn", GCN, aggregation="gcn",
               defaults=ModelDefaults(hidden=16, layers=2, dropout=0.5, lr=0.01, weight_decay=5e-4))
register_model("gin", GIN, aggregation="sum_self",
               defaults=ModelDefaults(hidden=64, layers=5, dropout=0.5, lr=0.01, weight_decay=0.0))
register_model("sage", SAGE, aggregation="mean",
               defaults=ModelDefaults(hidden=64, layers=2, dropout=0.5, lr=0.01, weight_decay=5e-4))
# GAT paper (transductive): 8 heads x 8 hidden per head, input dropout 0.6, lr 0.005. Its fused
# attention does not run through the plan, so the tuner (ps/dist/wpb/variant) has nothing to tune.
register_model("gat", GAT, aggregation=None,
               defaults=ModelDefaults(hidden=8, layers=2, dropout=0.6, lr=0.005, weight_decay=5e-4))

#: name -> class and name -> defaults, read from the registry (always current)
MODELS: RegistryView = RegistryView(lambda e: e.model)
MODEL_DEFAULTS: RegistryView = RegistryView(lambda e: e.defaults)


def build_model(name: str, in_dim: int, hidden: int | None, out_dim: int, layers: int | None = None,
                dropout: float | None = None, **options) -> GNN:
    """The registered model `name` ("gcn" | "gin" | "sage" | "gat" | ...); None hyperparameters take
    its registered defaults (`MODEL_DEFAULTS`). `options` whose value is not None go to the model's
    constructor (e.g. GIN's `norm`)."""
    entry = model_entry(name)
    d = entry.defaults
    extra = {k: v for k, v in options.items() if v is not None}
    return entry.model(in_dim, d.hidden if hidden is None else hidden, out_dim,
                       d.layers if layers is None else layers, d.dropout if dropout is None else dropout, **extra)
