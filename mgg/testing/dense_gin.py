"""A GIN test graph whose aggregation is a dense float32 matmul on the GPU, for tests about GIN's
MLP (batch norm, ReLU fusions) rather than its aggregation kernels."""
import torch


class DenseGraph:
    """The `dg` GINConv receives: one rank, the (A + I) matrix of a random multigraph as float32
    CUDA [n, n] in `A`."""

    comm = None
    world_size, rank = 1, 0

    def __init__(self, a_plus_i: torch.Tensor):
        self.A = a_plus_i


def dense_gin_input(monkeypatch, n: int = 700, edges: int = 6000, features: int = 12, seed: int = 0):
    """(x float32 CUDA [n, features], DenseGraph) of a random graph with `edges` edges, with
    mgg.nn.conv.gin_conv's `aggregate` patched to that matmul (kind "sum_self" only)."""
    import mgg.nn.conv.gin_conv as gin_mod

    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (edges,), generator=gen)
    dst = torch.randint(0, n, (edges,), generator=gen)
    dense = torch.zeros(n, n, dtype=torch.float64)
    dense.index_put_((dst, src), torch.ones(edges, dtype=torch.float64), accumulate=True)
    x = torch.randn(n, features, generator=gen).cuda()

    def sum_self(h, dg, kind, rows=None, compact=True):
        assert kind == "sum_self"
        return dg.A @ h

    monkeypatch.setattr(gin_mod, "aggregate", sum_self)
    return x, DenseGraph((dense + torch.eye(n, dtype=torch.float64)).float().cuda())
