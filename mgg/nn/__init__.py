"""GNN layers and models over a DistGraph (mgg.runtime), plus data-parallel helpers."""
from .conv import GATBlockConv, GATConv, GCNBlockConv, GCNConv, GINConv, GraphConv, SAGEBlockConv, SAGEConv
from .ddp import allreduce_gradients, allreduce_mean_gradients, broadcast_parameters
from .functional import Aggregate, aggregate, global_dropout
from .indexed_rows import IndexedRows
from .loss import cross_entropy_sum
from .models import GAT, GCN, GIN, GNN, MODEL_DEFAULTS, MODELS, SAGE, ModelDefaults, build_model
from .registry import ModelEntry, model_entry, model_names, register_model, register_sampled_model
from .sampled import SAMPLED_MODELS, SampledGAT, SampledGCN, SampledGNN, SampledSAGE

__all__ = ["IndexedRows", "Aggregate", "aggregate", "global_dropout", "cross_entropy_sum", "GraphConv", "GATConv", "GCNConv", "GINConv", "SAGEConv", "GNN", "GCN",
           "GIN", "GAT", "SAGE", "MODELS", "MODEL_DEFAULTS", "ModelDefaults", "build_model",
           "broadcast_parameters", "allreduce_gradients", "allreduce_mean_gradients", "SAGEBlockConv", "GCNBlockConv", "GATBlockConv", "SampledGNN", "SampledSAGE", "SampledGCN",
           "SampledGAT", "SAMPLED_MODELS",
           "ModelEntry", "model_entry", "model_names", "register_model", "register_sampled_model"]
