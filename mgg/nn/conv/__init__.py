"""Graph convolution layers over a DistGraph (one file per layer, as in PyG's nn/conv)."""
from .gat_block import GATBlockConv
from .gat_conv import GATConv
from .gcn_block import GCNBlockConv
from .gcn_conv import GCNConv
from .gin_conv import GINConv
from .sage_block import SAGEBlockConv
from .sage_conv import SAGEConv

__all__ = ["GATConv", "GCNConv", "GINConv", "SAGEConv", "SAGEBlockConv", "GCNBlockConv", "GATBlockConv"]
