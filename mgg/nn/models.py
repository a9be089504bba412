"""Whole-graph node classification models (GCN, GIN, SAGE, GAT) and their registrations.

Every model is a GNN (mgg.nn.gnn: a stack of GraphConvs, float32 [n_local, in_dim] features ->
float32 [n_local, out_dim] logits for this rank's nodes; `forward(x, dg, generator)`). Each model
class is followed by its one `register_model` call (mgg.nn.registry), which is how the CLI, the
benchmarks and the tests find it: a new convolution is its module in mgg/nn/conv/ plus its model
and registration here.
"""
from __future__ import annotations

import torch
from torch import nn

from .conv.gat_conv import GATConv
from .conv.gcn_conv import GCNConv
from .conv.gin_conv import GINConv
from .conv.sage_conv import SAGEConv
from .gnn import GNN
from .norm import make_norm
from .registry import ModelDefaults, RegistryView, model_entry, register_model

__all__ = ["GNN", "GCN", "GIN", "SAGE", "GAT", "ModelDefaults", "MODEL_DEFAULTS", "MODELS", "build_model"]


def _dims(in_dim: int, hidden: int, out_dim: int, layers: int) -> list[tuple[int, int]]:
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
    return list(zip(widths[:-1], widths[1:]))


class GCN(GNN):
    """Kipf & Welling GCN (default: 2 layers, hidden 16, dropout 0.5)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        super().__init__([GCNConv(a, b) for a, b in _dims(in_dim, hidden, out_dim, layers)], dropout)


register_model("gcn", GCN, aggregation="gcn",
               defaults=ModelDefaults(hidden=16, layers=2, dropout=0.5, lr=0.01, weight_decay=5e-4))


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


register_model("gin", GIN, aggregation="sum_self",
               defaults=ModelDefaults(hidden=64, layers=5, dropout=0.5, lr=0.01, weight_decay=0.0))


class SAGE(GNN):
    """GraphSAGE with the mean aggregator (default: 2 layers, hidden 64)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, dropout: float = 0.5):
        super().__init__([SAGEConv(a, b) for a, b in _dims(in_dim, hidden, out_dim, layers)], dropout)


register_model("sage", SAGE, aggregation="mean",
               defaults=ModelDefaults(hidden=64, layers=2, dropout=0.5, lr=0.01, weight_decay=5e-4))


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


# GAT paper (transductive): 8 heads x 8 hidden per head, input dropout 0.6, lr 0.005. Its fused
# attention does not run through the plan, so the tuner (ps/dist/wpb/variant) has nothing to tune.
register_model("gat", GAT, aggregation=None,
               defaults=ModelDefaults(hidden=8, layers=2, dropout=0.6, lr=0.005, weight_decay=5e-4))


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
