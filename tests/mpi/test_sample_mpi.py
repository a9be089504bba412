"""Sampled mini-batch training over P ranks: `mpirun -np 2|3 python -m pytest --with-mpi tests/mpi`.

Feature gathers through MPI RMA and the shared-memory host tier must return the source rows
(including rows owned by other ranks); the loader must give every rank the same number of steps
whatever its share of seeds; a short sampled training run keeps bit-identical replicas and learns.
"""
import numpy as np
import pytest
import torch

from mgg.runtime import MPIStore, partition_ranges, world
from mgg.sample import (HostTierFeatures, NeighborLoader, StoreFeatures, make_feature_source, split_seeds)
from mgg.train import TrainConfig, train
from tests.graphs import cached_dataset, random_csr

pytestmark = pytest.mark.mpi(min_size=2)


def features(n, f, seed=0):
    return np.random.default_rng(seed).standard_normal((n, f)).astype(np.float32)


@pytest.mark.parametrize("n", [101, 2])  # 2 nodes: more ranks than nodes, empty ranges
def test_store_features_gather_rows_of_every_rank(n):
    comm = world()
    indptr, _ = random_csr(n, 4 * n, seed=1)
    bounds = partition_ranges(indptr, comm.size)
    x = features(n, 5)
    feats = StoreFeatures.from_global(MPIStore(comm), bounds, x)
    rng = np.random.default_rng(comm.rank)
    for k in (0, 1, 17, 300):
        ids = rng.integers(0, n, k)
        out = feats.gather(torch.from_numpy(ids))
        assert torch.equal(out, torch.from_numpy(x[ids]))
        remote = int(((ids < bounds[comm.rank]) | (ids >= bounds[comm.rank + 1])).sum())
        assert feats.last.rows == k and feats.last.rows_remote == remote
    if n > comm.size:  # rows of every other rank really came over RMA
        others = np.setdiff1d(np.arange(n), np.arange(bounds[comm.rank], bounds[comm.rank + 1]))
        assert torch.equal(feats.gather(torch.from_numpy(others)), torch.from_numpy(x[others]))
        assert feats.last.rows_remote == len(others)
    comm.barrier()
    feats.close()


def test_host_tier_shared_window_equals_rows():
    comm = world()
    x = features(77, 3, seed=2)
    feats = HostTierFeatures(x, comm)
    assert feats._win is not None  # one shared-memory window per node
    ids = np.random.default_rng(comm.rank + 5).integers(0, 77, 40)
    assert torch.equal(feats.gather(torch.from_numpy(ids)), torch.from_numpy(x[ids]))
    assert torch.equal(feats.host_tensor, torch.from_numpy(x))
    assert feats.last.rows_host == 40 and feats.last.rows_remote == 0
    feats.close()
    # a budget below the slice picks the host tier, 0 (unlimited) the store
    bounds = partition_ranges(random_csr(77, 300, seed=0)[0], comm.size)
    for budget, tier in ((16, "host"), (0, "store")):
        f = make_feature_source(x, MPIStore(comm), bounds, comm, budget)
        assert f.tier == tier
        assert torch.equal(f.gather(torch.arange(77)), torch.from_numpy(x))
        comm.barrier()
        f.close()


def test_loader_steps_agree_with_unequal_seed_shares():
    comm = world()
    indptr, indices = random_csr(90, 600, seed=3)
    bounds = partition_ranges(indptr, comm.size)
    x = features(90, 4)
    feats = StoreFeatures.from_global(MPIStore(comm), bounds, x)
    # rank 0 gets 40 seeds, the last rank none, others 3
    seeds = np.arange(40) if comm.rank == 0 else (np.zeros(0, np.int64) if comm.rank == comm.size - 1
                                                  else np.arange(50, 53))
    loader = NeighborLoader((indptr, indices), feats, np.arange(90) % 4, seeds, [3, 2], 8, comm=comm, reorder=True)
    assert len(loader) == 5  # ceil(40 / 8) on every rank
    for _ in range(2):
        got = []
        for batch in loader:
            assert torch.equal(batch.x, torch.from_numpy(x[batch.n_id.numpy()]))
            got.append(batch.seeds.numpy())
            total = comm.allreduce_scalar(batch.batch_size)  # a collective per step: must not hang
            assert total >= 0
        assert len(got) == 5
        assert np.array_equal(np.sort(np.concatenate(got)), seeds)
    comm.barrier()
    feats.close()
    parts = comm.allgather(split_seeds(np.arange(0, 90, 7), comm, bounds))
    assert np.array_equal(np.concatenate(parts), np.arange(0, 90, 7))


def flat(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).numpy()


@pytest.mark.parametrize("dataset,kw", [
    ("default", {"fanout": (5, 5), "batch_size": 4}),
    ("sbm", {"fanout": (10, 5), "batch_size": 64, "reorder": True}),
    ("sbm", {"fanout": (5,), "batch_size": 100, "feature_memory_budget": 1024}),  # host tier
])
def test_sampled_training_keeps_replicas_identical_and_learns(dataset, kw):
    comm = world()
    g = cached_dataset(dataset)
    cfg = TrainConfig(dataset=dataset, mode="sampled", model="sage", epochs=6, backend="cpu", progress=False,
                      **kw)
    res = train(cfg, comm, g)
    w = flat(res.model)
    assert np.array_equal(w, comm.bcast(w))  # every rank holds the same replica
    losses = [e["loss"] for e in res.epochs]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert res.world_size == comm.size and res.sampling["steps_per_epoch"] >= 1
    if kw.get("feature_memory_budget"):
        assert res.sampling["feature_tier"] == "host"
    else:
        assert res.sampling["bytes_remote_total"] > 0  # other ranks' rows came over RMA
    # metrics are global: identical on every rank
    assert comm.bcast(res.test_acc) == res.test_acc and comm.bcast(losses) == losses


@pytest.mark.parametrize("dataset", ["default", "sbm"])
def test_p_ranks_sampled_full_neighborhood_equals_one_rank_full_graph(dataset):
    """fanout -1, one batch per rank, no dropout: the summed per-rank gradients are the full-graph
    gradient, so P ranks of --mode sampled train the 1-rank --mode full weights."""
    from mgg.runtime import Communicator

    comm = world()
    g = cached_dataset(dataset)
    common = dict(dataset=dataset, model="sage", epochs=8, backend="cpu", dropout=0.0, progress=False)
    samp = train(TrainConfig(mode="sampled", fanout=(-1, -1), batch_size=1 << 20, **common), comm, g)
    full = train(TrainConfig(**common), Communicator(comm=None), g)
    assert np.abs(flat(samp.model) - flat(full.model)).max() < 1e-4
    assert abs(samp.final_loss - full.final_loss) < 1e-5
