"""Baselines measured beside mgg in bench/fullgraph.py.

`NcclHaloGraph` is baseline (a), the comm-then-compute design MGG argues against: before every
aggregation each rank receives, with one NCCL all-to-all, every remote row it needs (the plan's
halo), then multiplies a local CSR matrix [n_local, n_local + H] by [x; halo] with torch sparse.
The backward runs the transposed matrix and a reverse all-to-all that returns the halo rows'
gradients to their owners. It offers the `aggregate(x, kind, transposed)` interface of DistGraph,
so the same mgg.nn models run on it unchanged.

`csr_gcn_matrix` builds the single-GPU torch sparse CSR matrix of baseline (c).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as tdist


def _csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape, device) -> torch.Tensor:
    order = np.lexsort((cols, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    crow = np.zeros(shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=shape[0]), out=crow[1:])
    return torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(cols.astype(np.int64)),
                                   torch.from_numpy(vals.astype(np.float32)), size=shape).to(device)


class NcclHaloGraph:
    """Baseline (a) over a DistGraph's plans (same partition, same weights)."""

    def __init__(self, dg, kinds=("gcn", "sum")):
        self.dg, self.comm = dg, dg.comm
        self.device, self.n_local, self.lo, self.hi = dg.device, dg.n_local, dg.lo, dg.hi
        self.world_size, self.rank = dg.world_size, dg.rank
        P = self.world_size
        self._mats: dict = {}
        self._ex: dict = {}
        for kind in kinds:
            for transposed in (False, True):
                self._build(kind, transposed)

    def local(self, arr):
        return arr[self.lo: self.hi]

    def _build(self, kind: str, transposed: bool) -> None:
        p = self.dg.plan(kind, transposed)
        n, H, P = p.n_local, p.halo_size, p.world_size
        tl = np.repeat(np.arange(n), np.diff(p.local_indptr))
        tr = np.repeat(np.arange(n), np.diff(p.remote_indptr))
        rows = np.concatenate([tl, tr, np.arange(n)])
        cols = np.concatenate([p.local_indices, n + p.remote_slot, np.arange(n)])
        vals = np.concatenate([p.local_weight, p.remote_weight, p.self_weight])
        A = _csr(rows, cols, vals, (n, n + H), self.device)
        # what every PE needs from me: exchange the halo requests once (host MPI)
        want = [p.halo_row[p.halo_ptr[q]: p.halo_ptr[q + 1]] for q in range(P)]
        asked = self.comm.comm.alltoall(want) if self.comm.comm is not None else want
        send_rows = torch.from_numpy(np.concatenate(asked).astype(np.int64)).to(self.device)
        self._mats[(kind, transposed)] = A
        self._ex[(kind, transposed)] = (send_rows, [len(a) for a in asked], list(np.diff(p.halo_ptr)))

    def _exchange(self, x: torch.Tensor, key) -> torch.Tensor:
        send_rows, send_counts, recv_counts = self._ex[key]
        send = x.index_select(0, send_rows)
        recv = torch.empty((sum(recv_counts), x.shape[1]), dtype=x.dtype, device=x.device)
        tdist.all_to_all_single(recv, send, output_split_sizes=recv_counts, input_split_sizes=send_counts)
        return recv

    def aggregate(self, x: torch.Tensor, kind: str, transposed: bool = False) -> torch.Tensor:
        """W x (or W^T x) = A [x; halo(x)], halo by an NCCL all-to-all of the rows each PE needs."""
        key = (kind, transposed)
        if key not in self._mats:
            self._build(kind, transposed)
        halo = self._exchange(x, key)
        return torch.sparse.mm(self._mats[key], torch.cat([x, halo], 0))


def csr_matrix_of(graph, kind: str, device) -> torch.Tensor:
    """The whole-graph N x N aggregation matrix (weights + self term) as torch sparse CSR."""
    from mgg.testing.reference import aggregation_matrix

    m = aggregation_matrix(graph.indptr, graph.indices, kind).tocsr()
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                   torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data.astype(np.float32)), size=m.shape).to(device)


class SingleGpuGraph:
    """Baseline (c): the whole graph on one GPU, aggregation = torch sparse CSR SpMM."""

    def __init__(self, graph, device, kinds=("gcn", "sum")):
        from types import SimpleNamespace

        self.device, self.n_local, self.lo, self.hi = device, graph.num_nodes, 0, graph.num_nodes
        self.comm = SimpleNamespace(size=1, rank=0)
        self.world_size, self.rank = 1, 0
        self._m = {}
        for kind in kinds:
            A = csr_matrix_of(graph, kind, device)
            self._m[(kind, False)] = A
            self._m[(kind, True)] = A.t().to_sparse_csr()

    def local(self, arr):
        return arr

    def aggregate(self, x: torch.Tensor, kind: str, transposed: bool = False) -> torch.Tensor:
        return torch.sparse.mm(self._m[(kind, transposed)], x)


def _device_csr(indptr: np.ndarray, indices: np.ndarray, vals: torch.Tensor | None, n: int, device,
                self_weight: float | None = None) -> torch.Tensor:
    """Torch sparse CSR [n, n] on `device` of the (row = target) CSR, optional +self_weight*I."""
    ptr = torch.from_numpy(np.asarray(indptr, np.int64)).to(device)
    col = torch.from_numpy(np.asarray(indices, np.int64)).to(device)
    row = torch.repeat_interleave(torch.arange(n, device=device), ptr[1:] - ptr[:-1])
    v = torch.ones(len(col), device=device) if vals is None else vals
    if self_weight is not None:
        ar = torch.arange(n, device=device)
        row, col = torch.cat([row, ar]), torch.cat([col, ar])
        v = torch.cat([v, torch.full((n,), float(self_weight), device=device)])
    return torch.sparse_coo_tensor(torch.stack([row, col]), v, (n, n)).coalesce().to_sparse_csr()


class _SpMM(torch.autograd.Function):
    """y = A x with the backward's A^T built once and kept (torch's own CSR backward transposes
    A on every call): what a user who profiles plain torch writes."""

    @staticmethod
    def forward(ctx, A, At, x):
        ctx.At = At
        return torch.sparse.mm(A, x)

    @staticmethod
    def backward(ctx, g):
        return None, None, torch.sparse.mm(ctx.At, g)


class SparseOperator:
    """A sparse CSR matrix and its transpose (built once) for plain-torch models: `op @ x`."""

    def __init__(self, A: torch.Tensor):
        self.A, self.At = A, A.t().to_sparse_csr()

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self.A, self.At, x)

    def rows(self, index: torch.Tensor) -> "SparseOperator":
        """The operator of rows `index` (int64 [k], sorted) only: [k, N] (the rows a loss reads)."""
        coo = self.A.to_sparse_coo().coalesce()
        r, c = coo.indices()
        n = self.A.shape[0]
        new = torch.full((n,), -1, dtype=torch.int64, device=r.device)
        new[index] = torch.arange(index.numel(), device=r.device)
        keep = new[r] >= 0
        sub = torch.sparse_coo_tensor(torch.stack([new[r[keep]], c[keep]]), coo.values()[keep],
                                      (index.numel(), self.A.shape[1])).coalesce()
        return SparseOperator(sub.to_sparse_csr())


class PlainTorchGCN(torch.nn.Module):
    """GCN as a user writes it in plain torch: h = A_hat (h W) + b per layer, each Linear on the
    narrow side of its SpMM (they commute); `A_out` (the operator's rows the loss reads, e.g.
    `A.rows(train)`) makes the last layer compute only those rows. `dropout`: the probability of
    the dropout before each layer in training (mgg's GNN: dropout -> conv -> ReLU)."""

    def __init__(self, dims: list[int], dropout: float = 0.0):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = float(dropout)

    def forward(self, x, A, A_out=None, out_index=None):
        """out_index: unused (A_hat holds the self loops, so A_out alone gives the rows)."""
        last = len(self.lins) - 1
        for i, lin in enumerate(self.lins):
            if self.dropout > 0.0:
                x = torch.nn.functional.dropout(x, self.dropout, training=self.training)
            op = A_out if (i == last and A_out is not None) else A
            if lin.out_features <= lin.in_features:
                x = op @ (x @ lin.weight.t()) + lin.bias
            else:
                x = lin(op @ x)
            if i < last:
                x = x.relu()
        return x


class PlainTorchGIN(torch.nn.Module):
    """GIN as PyG's GIN model builds it (and mgg's default GIN), in plain torch: per layer of
    output width w, the MLP Linear(in, w)-[BatchNorm1d]-ReLU-Linear(w, w) on the sum
    (A + (1 + eps) I) x, then on every layer but the last [BatchNorm1d]-ReLU-dropout. The MLP's
    first Linear runs before the sum: (A + (1 + eps) I)(x W1) + b1 == W1((A + (1 + eps) I) x) + b1.
    norm="batch": both norms (the first Linear without bias, torch.nn.BatchNorm1d over all rows);
    "none" drops them. `train_eps`: a learnt eps per layer, else GIN-0 (eps = 0, mgg's default:
    the node's own row added as is). `dropout`: the probability of the dropout between layers in
    training (none on the input, as PyG's and mgg's GIN)."""

    def __init__(self, dims: list[int], hidden: int, norm: str = "none", train_eps: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        if norm not in ("batch", "none"):
            raise ValueError(f"PlainTorchGIN: norm must be 'batch' or 'none', got {norm!r}")
        outs = dims[1:]
        self.l1 = torch.nn.ModuleList(torch.nn.Linear(a, b, bias=norm == "none") for a, b in zip(dims[:-1], outs))
        batch = norm == "batch"
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm1d(b) for b in outs) if batch else None
        self.l2 = torch.nn.ModuleList(torch.nn.Linear(b, b) for b in outs)
        self.post = torch.nn.ModuleList(torch.nn.BatchNorm1d(b) for b in outs[:-1]) if batch else None
        self.eps = torch.nn.Parameter(torch.zeros(len(self.l1))) if train_eps else None
        self.dropout = float(dropout)

    def _own(self, i: int, z: torch.Tensor) -> torch.Tensor:
        return z if self.eps is None else (1 + self.eps[i]) * z

    def forward(self, x, A, A_out=None, out_index=None):
        """A_out / out_index: the operator's rows the loss reads and their ids (the last layer
        then computes only those rows; with batch norm its statistics still take every row, so
        only the last Linear is narrowed)."""
        last = len(self.l1) - 1
        for i, (l1, l2) in enumerate(zip(self.l1, self.l2)):
            if i > 0 and self.dropout > 0.0:
                x = torch.nn.functional.dropout(x, self.dropout, training=self.training)
            z = x @ l1.weight.t()
            rows_only = i == last and A_out is not None
            if rows_only and self.norms is None:
                z = A_out @ z + self._own(i, z[out_index])
            else:
                z = A @ z + self._own(i, z)
            z = self.norms[i](z) if self.norms is not None else z + l1.bias
            if rows_only and self.norms is not None:
                z = z[out_index]
            x = l2(z.relu())
            if i < last:
                x = (self.post[i](x) if self.post is not None else x).relu()
        return x


class PlainTorchSAGE(torch.nn.Module):
    """GraphSAGE (mean aggregator) in plain torch: h = lin_l(M h) + lin_r(h) per layer, M the
    row-normalised adjacency (1 / deg_in per entry; an isolated row sums to 0), lin_l (with the
    bias) on the narrow side of its SpMM (they commute: M (h W) == (M h) W), lin_r (the root
    weight) without bias, as PyG's SAGEConv and mgg's. `A_out` / `out_index`: the operator's rows
    the loss reads and their ids (the last layer then computes only those rows). `dropout`: the
    probability of the dropout before each layer in training (dropout -> conv -> ReLU)."""

    def __init__(self, dims: list[int], dropout: float = 0.0):
        super().__init__()
        self.lin_l = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.lin_r = torch.nn.ModuleList(torch.nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = float(dropout)

    def forward(self, x, A, A_out=None, out_index=None):
        last = len(self.lin_l) - 1
        for i, (lin_l, lin_r) in enumerate(zip(self.lin_l, self.lin_r)):
            if self.dropout > 0.0:
                x = torch.nn.functional.dropout(x, self.dropout, training=self.training)
            rows_only = i == last and A_out is not None
            op, own = (A_out, x[out_index]) if rows_only else (A, x)
            if lin_l.out_features < lin_l.in_features:
                h = op @ (x @ lin_l.weight.t()) + lin_l.bias
            else:
                h = lin_l(op @ x)
            x = h + lin_r(own)
            if i < last:
                x = x.relu()
        return x


def layer_widths(in_dim: int, hidden: int, layers: int, classes: int) -> list[int]:
    """[in_dim, hidden, ..., hidden, classes]: the widths between `layers` layers."""
    return [int(in_dim)] + [int(hidden)] * (layers - 1) + [int(classes)]


def plain_torch_model(graph, mname: str, hidden: int, layers: int, device, norm: str = "none",
                      dropout: float = 0.0, train_eps: bool = True):
    """(model, op): the strongest simple one-GPU torch model for `mname` ('gcn' | 'gin' | 'sage')
    and its aggregation operator (a SparseOperator of D^-1/2 (A + I) D^-1/2 for GCN, of the plain
    adjacency for GIN's sum, of D^-1 A for SAGE's mean). `graph`: indptr, indices (the row = target CSR), x, y, num_nodes.
    `norm`: GIN's MLP normalisation ("batch" | "none"); `train_eps`: GIN's learnt eps (else
    GIN-0); `dropout`: before each layer in training."""
    n = graph.num_nodes
    dims = layer_widths(graph.x.shape[1], hidden, layers, int(graph.y.max()) + 1)
    if mname == "gcn":
        deg = torch.from_numpy(np.diff(graph.indptr).astype(np.float32) + 1).to(device)
        dinv = deg.rsqrt()
        ptr = torch.from_numpy(np.asarray(graph.indptr, np.int64)).to(device)
        col = torch.from_numpy(np.asarray(graph.indices, np.int64)).to(device)
        row = torch.repeat_interleave(torch.arange(n, device=device), ptr[1:] - ptr[:-1])
        A = _device_csr(graph.indptr, graph.indices, dinv[row] * dinv[col], n, device)
        A = (A.to_sparse_coo() + torch.sparse_coo_tensor(
            torch.arange(n, device=device).repeat(2, 1), dinv * dinv, (n, n))).coalesce().to_sparse_csr()
        return PlainTorchGCN(dims, dropout).to(device), SparseOperator(A)
    if mname == "gin":
        return PlainTorchGIN(dims, hidden, norm, train_eps, dropout).to(device), SparseOperator(_device_csr(graph.indptr, graph.indices, None, n, device))
    if mname == "sage":
        deg = torch.from_numpy(np.diff(graph.indptr).astype(np.float32)).to(device)
        ptr = torch.from_numpy(np.asarray(graph.indptr, np.int64)).to(device)
        row = torch.repeat_interleave(torch.arange(n, device=device), ptr[1:] - ptr[:-1])
        return PlainTorchSAGE(dims, dropout).to(device), SparseOperator(
            _device_csr(graph.indptr, graph.indices, 1.0 / deg[row], n, device))
    raise ValueError(f"plain torch baseline: no model {mname!r} (gcn, gin, sage)")


def pyg_adjacency(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, device, dtype=torch.float32) -> torch.Tensor:
    """The sparse ``adj_t`` PyG's documentation recommends for full-batch training: a torch CSR
    tensor [N, N] with adj_t[target, source] = 1 (mgg's row = target CSR as it is), which
    GCNConv, GINConv and SAGEConv take in place of ``edge_index`` (one SpMM per propagation
    instead of a gather and a scatter over the edges)."""
    return torch.sparse_csr_tensor(torch.from_numpy(np.asarray(indptr, np.int64)).to(device),
                                   torch.from_numpy(np.asarray(indices, np.int64)).to(device),
                                   torch.ones(len(indices), dtype=dtype, device=device), (num_nodes, num_nodes))


class PygModel(torch.nn.Module):
    """The same models in PyG: GCNConv (cached normalisation) or SAGEConv (mean), dropout -> conv
    -> ReLU per layer (none after the last); GIN: PyG's own `torch_geometric.nn.models.GIN`
    (norm="batch_norm" with `norm="batch"`), which mgg's GIN matches. `forward` takes
    ``edge_index`` [2, E] or the sparse ``adj_t`` of `pyg_adjacency`.
    Raises ImportError without torch_geometric."""

    def __init__(self, mname: str, in_dim: int, hidden: int, layers: int, classes: int, norm: str = "none",
                 dropout: float = 0.0, train_eps: bool = True):
        super().__init__()
        from torch_geometric.nn import GCNConv, SAGEConv
        from torch_geometric.nn.models import GIN

        dims = layer_widths(in_dim, hidden, layers, classes)
        self.gin = None
        convs = []
        if mname == "gcn":
            convs = [GCNConv(a, b, cached=True) for a, b in zip(dims[:-1], dims[1:])]
        elif mname == "gin":
            self.gin = GIN(in_dim, hidden, layers, classes, dropout=dropout,
                           norm="batch_norm" if norm == "batch" else None, train_eps=train_eps)
        elif mname == "sage":
            convs = [SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:])]
        else:
            raise ValueError(f"PyG baseline: no model {mname!r} (gcn, gin, sage)")
        self.convs = torch.nn.ModuleList(convs)
        self.dropout = float(dropout)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """x float32 [N, F], edge_index int64 [2, E] (source, target) or adj_t [N, N] -> logits
        [N, classes]."""
        if self.gin is not None:
            return self.gin(x, edge_index)
        for i, conv in enumerate(self.convs):
            if self.dropout > 0.0:
                x = torch.nn.functional.dropout(x, self.dropout, training=self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x
