"""Sharded embedding bags over P ranks (run with `mpirun -np 2|3 python -m pytest --with-mpi
tests/embedding/test_embedding_mpi.py`).

Every rank looks up its own batch; results and gradients must equal a single-process
torch.nn.EmbeddingBag holding the whole table.
"""
import numpy as np
import pytest
import torch

from mgg.embedding import MultiTableEmbeddingBag, RowWiseAdagrad, ShardedEmbeddingBag, SparseSGD, TableConfig, init_table
from mgg.runtime import world

pytestmark = pytest.mark.mpi(min_size=2)

N, D = 257, 5


def rank_batch(rank, seed, n_rows=N, n=80, bags=11):
    g = torch.Generator().manual_seed(seed * 101 + rank)
    idx = torch.randint(0, n_rows, (n,), generator=g)
    off = torch.cat([torch.tensor([0, 0]), torch.sort(torch.randint(0, n + 1, (bags - 2,), generator=g)).values])
    return idx, off


@pytest.mark.parametrize("sharding", ["range", "hash"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_sharded_forward_backward_equal_torch(sharding, mode):
    comm = world()
    emb = ShardedEmbeddingBag(N, D, mode, sharding, comm=comm, seed=11)
    assert emb.store.name == "mpi"
    ref = torch.nn.EmbeddingBag.from_pretrained(init_table(N, D, seed=11), freeze=False, mode=mode)
    idx, off = rank_batch(comm.rank, 1)
    psw = torch.rand(len(idx)) if mode == "sum" else None
    out = emb(idx, off, psw)
    assert torch.equal(out, ref(idx, off, psw))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(comm.rank))
    (out * g).sum().backward()
    # the reference gradient of the global batch: every rank's batch through one table
    parts = comm.allgather((idx, off, psw, g))
    ref.weight.grad = None
    for i, o, p, gg in parts:
        (ref(i, o, p) * gg).sum().backward()
    dense = emb.gather_gradient(emb.reduce_gradients())[0]
    torch.testing.assert_close(dense, ref.weight.grad, rtol=1e-6, atol=1e-6)
    emb.free()


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_sharded_training_equals_reference(opt):
    comm = world()
    emb = ShardedEmbeddingBag(N, D, "mean", "hash", comm=comm, seed=3)
    o = SparseSGD(emb, lr=0.2) if opt == "sgd" else RowWiseAdagrad(emb, lr=0.1)
    w, s = init_table(N, D, seed=3), torch.zeros(N)
    for step in range(3):
        idx, off = rank_batch(comm.rank, 10 + step)
        (emb(idx, off) - 1.0).square().sum().backward()
        o.step()
        ref = torch.nn.EmbeddingBag.from_pretrained(w.clone(), freeze=False, mode="mean")
        for r in range(comm.size):
            i, of = rank_batch(r, 10 + step)
            (ref(i, of) - 1.0).square().sum().backward()
        g = ref.weight.grad
        if opt == "sgd":
            w = w - 0.2 * g
        else:
            t = (g != 0).any(1)
            s[t] += (g[t] ** 2).mean(1)
            w = w.clone()
            w[t] -= 0.1 * g[t] / (s[t].sqrt() + 1e-10).unsqueeze(1)
        torch.testing.assert_close(emb.weight(), w, rtol=1e-5, atol=1e-6)
    emb.free()


def test_multitable_one_exchange():
    comm = world()
    cfgs = [TableConfig(30, 4, "sum", "range", "a"), TableConfig(101, 7, "max", "hash", "b"),
            TableConfig(2, 7, "mean", "range", "c")]  # c: fewer rows than ranks at P=3
    m = MultiTableEmbeddingBag(cfgs, comm, seed=1)
    refs = [torch.nn.EmbeddingBag.from_pretrained(init_table(c.num_embeddings, c.embedding_dim, seed=1 + t),
                                                  freeze=False, mode=c.mode) for t, c in enumerate(cfgs)]
    ins = [rank_batch(comm.rank, 5 + t, n_rows=c.num_embeddings) for t, c in enumerate(cfgs)]
    calls = []
    orig = m.array.get_halo
    m.array.get_halo = lambda *a, **k: calls.append(1) or orig(*a, **k)
    outs = m([i for i, _ in ins], [o for _, o in ins])
    assert len(calls) == 1  # all tables in one exchange
    for t in range(3):
        assert torch.equal(outs[t], refs[t](*ins[t]))
    sum(o.sum() for o in outs).backward()
    grads = m.gather_gradient(m.reduce_gradients())
    for r, part in enumerate(comm.allgather(ins)):
        for t in range(3):
            refs[t](*part[t]).sum().backward()
    for t in range(3):
        torch.testing.assert_close(grads[t], refs[t].weight.grad, rtol=1e-6, atol=1e-6)
    for t in range(3):
        assert torch.equal(m.gather_table(t), refs[t].weight.detach())
    m.free()


def test_bad_input_on_one_rank_does_not_hang():
    comm = world()
    emb = ShardedEmbeddingBag(N, D, "sum", comm=comm)
    if comm.rank == 1:
        with pytest.raises(IndexError):
            emb(torch.tensor([N]), torch.tensor([0]))
    out = emb(torch.tensor([0, N - 1]), torch.tensor([0]))  # forward is not collective: others go on
    assert out.shape == (1, D)
    emb.free()
