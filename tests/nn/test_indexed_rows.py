"""mgg.nn.IndexedRows: a layer input read from a table through an index. The block sums, the
block convolutions and the sampled models give with IndexedRows(table, index) exactly what they
give with the gathered rows table[index] (outputs and the weights' gradients), against dense
float64 math for the sums."""
import numpy as np
import pytest
import torch

from mgg.nn import IndexedRows, SampledGAT, SampledGCN, SampledSAGE, SAGEBlockConv, GCNBlockConv
from mgg.nn.block_sum import BlockDropout, block_sum
from mgg.nn.functional import hash_uniform
from mgg.nn.indexed_rows import head_rows, materialize
from mgg.testing.blocks import block_dense, random_block


def indexed(n_rows: int, width: int, n_table: int = 90, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(n_table, width, generator=g, dtype=dtype)
    index = torch.randint(0, n_table, (n_rows,), generator=g)
    return IndexedRows(table, index)


def test_indexed_rows_are_the_tables_rows():
    rows = indexed(40, 6)
    assert rows.shape == (40, 6) and rows.dtype == torch.float32 and rows.dim() == 2 and not rows.is_cuda
    want = rows.table.numpy()[rows.index.numpy()]
    np.testing.assert_array_equal(rows.materialize().numpy(), want)
    np.testing.assert_array_equal(head_rows(rows, 7).numpy(), want[:7])
    np.testing.assert_array_equal(materialize(rows).numpy(), want)
    t = torch.ones(3, 2)
    assert materialize(t) is t and head_rows(t, 2).shape == (2, 2)


def test_indexed_rows_refuse_what_they_cannot_hold():
    with pytest.raises(ValueError, match="table must be"):
        IndexedRows(torch.zeros(4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="1-D int64"):
        IndexedRows(torch.zeros(4, 2), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="takes no gradient"):
        IndexedRows(torch.zeros(4, 2, requires_grad=True), torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_block_sum_of_indexed_rows_equals_dense_math(p):
    block = random_block(n_dst=25, n_src=60, max_deg=8, seed=3)
    rows = indexed(60, 5, seed=1)
    src = torch.rand(60) + 0.5
    dst = torch.rand(25) + 0.5
    drop = BlockDropout(p, 2 ** 41 + 3) if p else None
    out = block_sum(rows, block, src, dst, drop)
    x64 = rows.materialize().double().numpy()
    if drop is not None:  # rows numbered by their position j in the input, not by their table row
        x64 = x64 * (hash_uniform(torch.arange(60), 5, drop.seed).numpy() >= p) / (1 - p)
    a = block_dense(block) * src.double().numpy()[None, :] * dst.double().numpy()[:, None]
    np.testing.assert_allclose(out.numpy(), a @ x64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("conv_cls,fin,fout", [(SAGEBlockConv, 6, 10), (SAGEBlockConv, 10, 6),
                                               (GCNBlockConv, 6, 10), (GCNBlockConv, 10, 6)])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_block_convs_read_indexed_rows_as_the_gathered_rows(conv_cls, fin, fout, p):
    torch.manual_seed(0)
    conv = conv_cls(fin, fout).double()
    block = random_block(12, 40, 6, seed=fin * fout)
    rows = indexed(40, fin, seed=2, dtype=torch.float64)
    drop = BlockDropout(p, 777) if p else None
    out = conv(rows, block, drop=drop)
    out.square().sum().backward()
    got = [q.grad.clone() for q in conv.parameters()]
    conv.zero_grad()
    want = conv(rows.materialize(), block, drop=drop)
    want.square().sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, (q.grad for q in conv.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model_cls", [SampledSAGE, SampledGCN, SampledGAT])
@pytest.mark.parametrize("dropout", [0.0, 0.5, 1.0])
def test_sampled_models_take_indexed_rows(model_cls, dropout):
    """SAGE and GCN read the table through the index, GAT gets the gathered rows; the same logits."""
    torch.manual_seed(1)
    model = model_cls(8, 16, 4, layers=2, dropout=dropout).double()
    blocks = [random_block(30, 80, 7, seed=5), random_block(6, 30, 5, seed=6)]
    rows = indexed(80, 8, seed=4, dtype=torch.float64)
    a = model(rows, blocks, torch.Generator().manual_seed(9))
    b = model(rows.materialize(), blocks, torch.Generator().manual_seed(9))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert a.shape == (6, 4) and torch.isfinite(a).all()
