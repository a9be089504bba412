"""Graph convolution layers over a DistGraph (one file per layer, as in PyG's nn/conv), each a
GraphConv (base.py: the hooks mgg.nn.gnn.GNN fuses through), and their block twins for sampled
training."""
from .base import GraphConv
from .gat_block import GATBlockConv
from .gat_conv import GATConv
from .gcn_block import GCNBlockConv
from .gcn_conv import GCNConv
from .gin_conv import GINConv
from .sage_block import SAGEBlockConv
from .sage_conv import SAGEConv

__all__ = ["GraphConv", "GATConv", "GCNConv", "GINConv", "SAGEConv", "SAGEBlockConv", "GCNBlockConv", "GATBlockConv"]
