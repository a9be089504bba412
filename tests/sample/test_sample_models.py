"""GCN and GAT on sampled blocks (mgg.nn.GCNBlockConv, GATBlockConv, SampledGCN, SampledGAT)
against float64 references written from the formulas (dense matrices, per-node loops), and
against the full-graph models when a block holds every node with all its neighbors."""
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mgg.nn import GAT, GCN, GATBlockConv, GCNBlockConv, SampledGAT, SampledGCN
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig
from mgg.sample import sample_blocks
from mgg.testing.graphs import random_csr


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def one_block(fanout=4, seed=6, n=40, seeds=(3, 7, 0, 22, 39, 11)):
    """A sampled block of a random graph with self loops and duplicate edges."""
    indptr, indices = random_csr(n, 6 * n, seed=seed)
    _, (block,) = sample_blocks(indptr, indices, torch.tensor(seeds), [fanout], gen(seed))
    return block


def symmetric_csr(n=50, m=160, seed=3):
    """An undirected graph (both directions stored) with a few self loops, int64 CSR."""
    rng = np.random.default_rng(seed)
    a = sp.coo_matrix((np.ones(m), (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n)).tocsr()
    a = ((a + a.T) > 0).astype(np.float64).tocsr()
    a.sort_indices()
    return a.indptr.astype(np.int64), a.indices.astype(np.int64)


def block_matrix(block) -> np.ndarray:
    """float64 [n_dst, n_src]: edge counts of the block."""
    a = np.zeros((block.n_dst, block.n_src))
    np.add.at(a, (block.row.numpy(), block.col.numpy()), 1.0)
    return a


# -- GCN ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6), (5, 5)])
def test_gcn_block_conv_equals_dense_reference(fin, fout):
    """out = b + (x_i / D_i + deg(i) / s(i) sum_{j in S(i)} x_j / sqrt(D_i D_j)) W with the graph's
    degrees D = deg + 1 (Block.src_degree), float64 dense math."""
    block = one_block()
    conv = GCNBlockConv(fin, fout).double()
    with torch.no_grad():
        conv.bias.normal_()
    h = torch.randn(block.n_src, fin, dtype=torch.float64, requires_grad=True)
    a = block_matrix(block)                                        # [n_dst, n_src] sampled edge counts
    deg = block.src_degree.numpy().astype(np.float64)
    d = deg + 1.0
    s = a.sum(1)
    assert (deg[: block.n_dst] >= s).all()                          # a node has at least its sampled edges
    scale = np.where(s > 0, deg[: block.n_dst] / np.maximum(s, 1.0), 0.0)
    norm = a * scale[:, None] / np.sqrt(np.outer(d[: block.n_dst], d))
    norm[np.arange(block.n_dst), np.arange(block.n_dst)] += 1.0 / d[: block.n_dst]   # the self loops
    ref = torch.from_numpy(norm) @ h @ conv.lin.weight.T + conv.bias
    assert torch.allclose(conv(h, block), ref, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: conv(t, block), (h,), eps=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="src nodes"):
        conv(h[:-1], block)


def test_gcn_block_conv_needs_the_graph_degrees():
    block = one_block()
    block.src_degree = None
    with pytest.raises(ValueError, match="Block.src_degree"):
        GCNBlockConv(3, 2)(torch.randn(block.n_src, 3), block)


def test_gcn_block_sum_is_an_unbiased_estimate_of_the_full_aggregation():
    """Averaged over many samples of fanout 3, a seed's sampled GCN sum approaches the full
    graph's D^-1/2 (A + I) D^-1/2 x (the estimator the training and the evaluation share)."""
    indptr, indices = random_csr(60, 900, seed=4)
    x = torch.randn(60, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # fixed: no flaky draw
    conv = GCNBlockConv(4, 4, bias=False).double()
    with torch.no_grad():
        conv.lin.weight.copy_(torch.eye(4))
    seeds = torch.tensor([5, 17, 33])
    outs = []
    for k in range(400):
        n_id, (block,) = sample_blocks(indptr, indices, seeds, [3], gen(k))
        outs.append(conv(x[n_id], block))
    est = torch.stack(outs).mean(0)
    deg = np.diff(indptr).astype(np.float64)
    a = np.zeros((60, 60))
    np.add.at(a, (np.repeat(np.arange(60), np.diff(indptr)), indices), 1.0)
    a += np.eye(60)
    full = (a / np.sqrt(np.outer(deg + 1, deg + 1))) @ x.numpy()
    assert np.allclose(est.detach().numpy(), full[seeds.numpy()], atol=0.06)
    assert not np.allclose(outs[0].detach().numpy(), full[seeds.numpy()], atol=0.06)  # one sample is not


def test_sampled_gcn_over_every_node_equals_the_full_graph_gcn():
    """Every node a seed, fanout -1: every neighbor is sampled (deg(i) / s(i) = 1), and SampledGCN
    computes the full-graph GCN (D^-1/2 (A + I) D^-1/2) with the same weights."""
    indptr, indices = symmetric_csr()
    n = len(indptr) - 1
    x = torch.randn(n, 7)
    model = SampledGCN(7, 16, 4, layers=2, dropout=0.5).eval()
    n_id, blocks = sample_blocks(indptr, indices, torch.arange(n), [-1, -1], gen())
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(backend="cpu"))
    full = model.to_full_graph()
    assert isinstance(full, GCN) and not full.training
    assert torch.allclose(model(x, blocks), full(x, dg, None), atol=1e-5)
    dg.close()


# -- GAT ------------------------------------------------------------------------------------------
def gat_reference(conv: GATBlockConv, h_in: torch.Tensor, block) -> torch.Tensor:
    """float64 per-node loop: every dst i attends over its sampled src nodes other than itself,
    plus itself once."""
    heads, c = conv.heads, conv.out_channels
    wh = (h_in @ conv.lin.weight.T).view(-1, heads, c)
    ptr, col = block.ptr.numpy(), block.col.numpy()
    rows = []
    for i in range(block.n_dst):
        nbrs = [int(j) for j in col[ptr[i]:ptr[i + 1]] if j != i] + [i]
        if conv.attention == "additive":
            e = torch.stack([(wh[i] * conv.att_dst[0]).sum(-1) + (wh[j] * conv.att_src[0]).sum(-1) for j in nbrs])
            e = torch.where(e > 0, e, conv.negative_slope * e)
        else:
            e = torch.stack([(wh[i] * wh[j]).sum(-1) / math.sqrt(c) for j in nbrs])
        alpha = torch.softmax(e, dim=0)                                   # [len(nbrs), heads]
        rows.append(sum(alpha[k].unsqueeze(-1) * wh[j] for k, j in enumerate(nbrs)))
    out = torch.stack(rows)
    out = out.reshape(block.n_dst, heads * c) if conv.concat else out.mean(dim=1)
    return out + conv.bias


@pytest.mark.parametrize("heads,concat", [(2, True), (3, False), (1, True)])
@pytest.mark.parametrize("attention", ["additive", "dot"])
def test_gat_block_conv_equals_per_node_reference(heads, concat, attention):
    block = one_block(fanout=5, seed=8)
    conv = GATBlockConv(6, 4, heads=heads, concat=concat, attention=attention).double()
    with torch.no_grad():
        conv.bias.normal_()
    h = torch.randn(block.n_src, 6, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(conv(h, block), gat_reference(conv, h, block), atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: conv(t, block), (h,), eps=1e-6, atol=1e-6)


def test_gat_block_conv_drops_sampled_self_edges():
    """A row whose sampled edges are all self edges attends to itself once: out = Wh_i + b."""
    from mgg.sample import Block

    ptr = torch.tensor([0, 3, 3])
    block = Block(ptr, torch.tensor([0, 0, 0]), 3, 2)   # dst 0: three self edges, dst 1: none
    conv = GATBlockConv(3, 2, heads=2).double()
    h = torch.randn(3, 3, dtype=torch.float64)
    want = (h[:2] @ conv.lin.weight.T) + conv.bias
    assert torch.allclose(conv(h, block), want, atol=1e-12)
    conv.add_self_loops = False  # without loops: dst 0 averages its three copies of itself, dst 1 is 0
    out = conv(h, block)
    assert torch.allclose(out[0], want[0], atol=1e-12) and torch.allclose(out[1], conv.bias, atol=1e-12)


def test_gat_block_attention_dropout_is_seeded():
    block = one_block()
    conv = GATBlockConv(5, 3, heads=2, dropout=0.5)
    x = torch.randn(block.n_src, 5)
    conv.generator = torch.Generator().manual_seed(1)
    a = conv(x, block)
    conv.generator = torch.Generator().manual_seed(1)
    assert torch.equal(a, conv(x, block))
    conv.eval()
    assert not torch.equal(a, conv(x, block))


def test_sampled_gat_over_every_node_equals_the_full_graph_gat():
    """Every node a seed, fanout -1 (a directed graph with self loops and duplicate edges): the
    block attention is the full-graph GAT's, with the same weights."""
    indptr, indices = random_csr(60, 400, seed=2)
    x = torch.randn(60, 7)
    model = SampledGAT(7, 4, 3, layers=2, dropout=0.6, heads=2).eval()
    _, blocks = sample_blocks(indptr, indices, torch.arange(60), [-1, -1], gen())
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(backend="cpu"))
    full = model.to_full_graph()
    assert isinstance(full, GAT) and not full.training
    assert torch.allclose(model(x, blocks), full(x, dg, None), atol=1e-5)
    dg.close()


@pytest.mark.parametrize("cls", [SampledGCN, SampledGAT])
def test_sampled_models_take_empty_batches_and_check_their_blocks(cls):
    indptr, indices = random_csr(30, 100, seed=1)
    _, blocks = sample_blocks(indptr, indices, torch.zeros(0, dtype=torch.int64), [3, 2], gen())
    model = cls(2, 4, 3, 2)
    out = model(torch.zeros(0, 2), blocks)
    assert out.shape == (0, 3)
    torch.nn.functional.cross_entropy(out, torch.zeros(0, dtype=torch.int64), reduction="sum").backward()
    with pytest.raises(ValueError, match="has 2 layers, got 1 blocks"):
        model(torch.zeros(0, 2), blocks[:1])
