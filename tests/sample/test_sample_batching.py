"""Global batches of data-parallel mini-batch training (mgg.sample.batching), the mean-gradient
all-reduce (mgg.nn.allreduce_mean_gradients) and the sampled mode's batch-size and budget rules,
on one process. The multi-rank side is in tests/sample/test_sample_mpi.py."""
import numpy as np
import pytest
import torch

from mgg.apps.sampled import check_feature_budget, sampled_batch_size
from mgg.nn import allreduce_mean_gradients
from mgg.runtime import Communicator
from mgg.sample import BatchPlan, NeighborLoader, TensorFeatures, epoch_order
from mgg.train import UserError
from mgg.testing.graphs import random_csr


@pytest.mark.parametrize("n", [0, 1, 5, 7, 64, 101])
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_plan_shares_cover_every_global_batch(n, batch, world, drop_last):
    plans = [BatchPlan(n, batch, world, r, drop_last) for r in range(world)]
    g = world * batch
    steps = n // g if drop_last else -(-n // g)
    bounds = plans[0].global_bounds()
    assert plans[0].steps == steps and len(bounds) == steps + 1 and bounds[0] == 0
    sizes = np.diff(bounds)
    if steps:
        assert bounds[-1] == (steps * g if drop_last else n)
        assert sizes.max() <= g and sizes.max() - sizes.min() <= 1
        assert (sizes == g).all() if drop_last else sizes.min() >= 1
    shares = [p.shares() for p in plans]
    for s in range(steps):
        # the ranks' shares tile global batch s in rank order, each at most `batch` seeds
        assert shares[0][s][0] == bounds[s] and shares[-1][s][1] == bounds[s + 1]
        for r in range(world - 1):
            assert shares[r][s][1] == shares[r + 1][s][0]
        widths = [int(sh[s][1] - sh[s][0]) for sh in shares]
        assert max(widths) <= batch and max(widths) - min(widths) <= 1
    assert all(p.max_share == (max(int(sh[:, 1].__sub__(sh[:, 0]).max()) for sh in shares) if steps else 0)
               for p in plans)


@pytest.mark.parametrize("n,b", [(100, 5), (37, 4), (9, 1)])
def test_global_batches_do_not_depend_on_the_rank_count(n, b):
    """P = 1 with batch 2b and P = 2 with batch b have the same global batches."""
    one = BatchPlan(n, 2 * b).global_bounds()
    two = BatchPlan(n, b, 2, 1).global_bounds()
    assert np.array_equal(one, two)
    assert np.array_equal(epoch_order(n, 3, 2), epoch_order(n, 3, 2))
    assert not np.array_equal(epoch_order(n, 3, 2), epoch_order(n, 3, 3))
    assert np.array_equal(np.sort(epoch_order(n, 3, 2)), np.arange(n))
    assert np.array_equal(epoch_order(n, 3, 2, shuffle=False), np.arange(n))


def test_plan_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        BatchPlan(10, 0)
    with pytest.raises(ValueError, match="rank 2 out of range"):
        BatchPlan(10, 1, 2, 2)


def test_loader_yields_the_global_batches_of_the_plan():
    """The loader's batches at P = 1 are the plan's global batches of the epoch order, and two
    ranks' shares of the same plan (batch halved) put them together again."""
    indptr, indices = random_csr(90, 500, seed=7)
    x = np.random.default_rng(1).standard_normal((90, 3)).astype(np.float32)
    seeds = np.arange(3, 90, 2)
    loader = NeighborLoader((indptr, indices), TensorFeatures(x), np.arange(90) % 3, seeds, [2], 10, seed=5)
    for epoch in (1, 2):
        got = [b.seeds.numpy() for b in loader]
        order = epoch_order(len(seeds), 5, epoch)
        bounds = BatchPlan(len(seeds), 10).global_bounds()
        assert [g.tolist() for g in got] == [seeds[order[a:z]].tolist() for a, z in zip(bounds[:-1], bounds[1:])]
        halves = [BatchPlan(len(seeds), 5, 2, r).shares() for r in range(2)]
        for s, g in enumerate(got):
            joined = np.concatenate([seeds[order[h[s][0]:h[s][1]]] for h in halves])
            assert np.array_equal(joined, g)


def test_mean_gradients_on_one_rank():
    comm = Communicator(comm=None)
    lin = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3, dtype=torch.float32)
    y = torch.tensor([0, 1, 1, 0, 1])
    torch.nn.functional.cross_entropy(lin(x), y, reduction="sum").backward()
    want = torch.autograd.grad(torch.nn.functional.cross_entropy(lin(x), y), lin.weight)[0]
    assert allreduce_mean_gradients(lin, comm, 5) == 5.0
    assert torch.allclose(lin.weight.grad, want, atol=1e-6)
    lin.zero_grad()
    assert allreduce_mean_gradients(lin, comm, 0) == 0.0  # an empty step: gradients stay 0
    assert all((p.grad == 0).all() for p in lin.parameters())


def test_batch_size_rules():
    assert sampled_batch_size(None, 100, 1) == 100            # the default, capped at the training set
    assert sampled_batch_size(None, 5000, 2) == 1024
    assert sampled_batch_size(None, 7, 4) == 2
    assert sampled_batch_size(50, 101, 2) == 50 and sampled_batch_size(51, 101, 2) == 51
    with pytest.raises(UserError, match=r"--batch-size 52 is larger than the training set allows: 101 training "
                                        r"nodes, over 2 ranks, at most 51 per rank and step; use --batch-size 51"):
        sampled_batch_size(52, 101, 2)
    with pytest.raises(UserError, match=r"--batch-size 11 is larger .* 10 training nodes, at most 10 per"):
        sampled_batch_size(11, 10, 1)
    with pytest.raises(UserError, match="no training nodes"):
        sampled_batch_size(None, 0, 2)


def test_feature_budget_rule():
    check_feature_budget(0, 1024, 100)                       # 0: no limit
    check_feature_budget(1024 * 400, 1024, 100)
    with pytest.raises(UserError, match=r"--feature-memory-budget 409599 bytes cannot hold one mini-batch: .* "
                                        r"its 1024 seeds \(1024 x 100 x 4 = 409600 bytes\)"):
        check_feature_budget(409599, 1024, 100)
