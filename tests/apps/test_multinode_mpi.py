"""Simulated multi-node runs, node-aware plans and checkpoint/resume over P ranks.

`mpirun -np P python -m pytest --with-mpi tests/apps/test_multinode_mpi.py` (tests/run_all.sh runs
it with P = 2, 3 and 4). `ranks_per_node` groups the ranks into simulated nodes:
P=2 -> 2 nodes x 1, P=3 -> nodes [0, 0, 1], P=4 -> 2 nodes x 2.
"""
import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from mgg.checkpoint import LAST, read_checkpoint
from mgg.runtime import Communicator, world
from mgg.graph import DistGraph, RuntimeConfig
from mgg.testing.graphs import cached_dataset
from mgg.train import TrainConfig, UserError, train

pytestmark = pytest.mark.mpi(min_size=2)

graph = cached_dataset


def rpn(size):
    return (size + 1) // 2


def flat(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).numpy()


def losses(res):
    return np.array([e["loss"] for e in res.epochs])


def shared_dir(tmp_path_factory, name):
    comm = world()
    d = str(tmp_path_factory.mktemp(name)) if comm.rank == 0 else None
    return comm.bcast(d)


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_simulated_nodes_train_the_one_node_weights(model):
    comm = world()
    g = graph("sbm")
    base = TrainConfig(dataset="sbm", model=model, epochs=8, backend="cpu", ps=8, dist=2, wpb=2,
                       progress=False)
    before = comm.ranks_per_node
    nodes = train(replace(base, ranks_per_node=rpn(comm.size), ps_inter=2), comm, g)
    assert comm.ranks_per_node == before  # the override is the run's, not the communicator's
    one_node = train(base, comm, g)
    ref = train(base, Communicator(comm=None), g)
    print(f"{model} P={comm.size} nodes={comm.size // rpn(comm.size)}: max |w - w_1| = "
          f"{np.abs(flat(nodes.model) - flat(ref.model)).max():.2e}")
    np.testing.assert_allclose(flat(nodes.model), flat(ref.model), rtol=0, atol=1e-5)
    np.testing.assert_allclose(flat(nodes.model), flat(one_node.model), rtol=0, atol=1e-5)
    np.testing.assert_allclose(losses(nodes), losses(ref), rtol=0, atol=1e-5)


def test_plans_have_other_node_partitions_cut_by_ps_inter():
    comm = world()
    g = graph("sbm")
    saved, comm.ranks_per_node = comm.ranks_per_node, rpn(comm.size)
    try:
        dgs = {pi: DistGraph.build(g, comm, RuntimeConfig(ps=16, ps_inter=pi, backend="cpu"))
               for pi in (None, 2)}
    finally:
        comm.ranks_per_node = saved
    try:
        node = np.arange(comm.size) // rpn(comm.size)
        for pi, dg in dgs.items():
            assert np.array_equal(dg.node_of_pe, node)
            for transposed in (False, True):
                p = dg.plan("gcn", transposed)
                assert p.ps_inter == (pi or 16)
                sizes = p.remote_parts[:, 2] - p.remote_parts[:, 1]
                for (_, s, e), inter, size in zip(p.remote_parts, p.remote_part_inter, sizes):
                    on_other = node[p.remote_pe[s:e]] != node[comm.rank]
                    assert on_other.all() if inter else not on_other.any()
                    assert size <= (p.ps_inter if inter else p.ps)
        p16, p2 = dgs[None].plan("gcn"), dgs[2].plan("gcn")
        # every rank reads from another node on this graph (SBM edges cross all ranges)
        assert p2.remote_part_inter.any() and p16.remote_part_inter.any()
        assert (p2.remote_parts[p2.remote_part_inter, 2] - p2.remote_parts[p2.remote_part_inter, 1]).max() <= 2
        # ps_inter cuts only the other-node class: more, smaller inter partitions; same-node unchanged
        assert p2.remote_part_inter.sum() > p16.remote_part_inter.sum()
        assert (~p2.remote_part_inter).sum() == (~p16.remote_part_inter).sum()
        has_same = comm.allgather(bool((~p2.remote_part_inter).any()))
        if comm.size >= 3:  # some rank has a peer on its own node
            assert any(has_same)
    finally:
        for dg in dgs.values():
            dg.close()


def test_resume_equals_uninterrupted_on_p_ranks(tmp_path_factory):
    comm = world()
    d = shared_dir(tmp_path_factory, "ckpt")
    g = graph("sbm")
    base = TrainConfig(dataset="sbm", model="gcn", epochs=8, backend="cpu", ps=8, progress=False)
    straight = train(base, comm, g)
    train(replace(base, epochs=4, checkpoint_dir=d), comm, g)
    torch.rand(3)  # an unrelated draw: the checkpoint restores every RNG
    second = train(replace(base, checkpoint_dir=d, resume="auto"), comm, g)
    assert second.start_epoch == 4 and second.resumed_from == os.path.join(d, LAST)
    np.testing.assert_allclose(losses(second), losses(straight), rtol=0, atol=1e-6)
    np.testing.assert_allclose(flat(second.model), flat(straight.model), rtol=0, atol=1e-6)
    assert np.array_equal(flat(second.model), comm.bcast(flat(second.model)))
    if comm.rank == 0:
        assert read_checkpoint(os.path.join(d, LAST))["world_size"] == comm.size


def test_unusable_checkpoints_are_refused_on_every_rank(tmp_path_factory):
    comm = world()
    g = graph("default")
    d = shared_dir(tmp_path_factory, "bad")
    base = TrainConfig(epochs=2, backend="cpu", progress=False)
    train(replace(base, checkpoint_dir=d), comm, g)
    ck = os.path.join(d, LAST)
    with pytest.raises(UserError, match=r"hidden=16 in the checkpoint, 4 now") as info:
        train(replace(base, epochs=4, hidden=4, resume=ck), comm, g)
    assert ck in str(info.value)
    # one rank's checkpoint of a 1-rank run: another world size
    solo = shared_dir(tmp_path_factory, "solo")
    if comm.rank == 0:
        train(replace(base, checkpoint_dir=solo), Communicator(comm=None), g)
    comm.barrier()
    with pytest.raises(UserError, match=f"world size 1 in the checkpoint, {comm.size} now"):
        train(replace(base, epochs=4, resume=solo), comm, g)
    if comm.rank == 0:
        with open(ck, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            f.write(b"XXXXX")
    comm.barrier()
    with pytest.raises(UserError, match=f"{ck}: corrupt: sha256"):
        train(replace(base, epochs=4, resume=ck), comm, g)
