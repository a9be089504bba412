"""Multi-rank training in a relabelled node order: `mpirun -np 2 python -m pytest --with-mpi tests/mpi`.

P ranks training the METIS- or cluster-ordered graph compute the losses one rank computes on the
input order (dropout 0; the split is drawn in the user's ids), and every rank relabels alike.
"""
import numpy as np
import pytest

from mgg.data.reorder import reorder_nodes
from mgg.runtime import Communicator, world
from mgg.testing.communities import shuffled_communities
from mgg.train import TrainConfig, train

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("model", ["gcn", "gin"])
@pytest.mark.parametrize("method", ["metis", "cluster"])
def test_p_ranks_on_a_relabelled_graph_train_the_one_rank_input_order_losses(model, method):
    if method == "metis":
        pytest.importorskip("pymetis")
    comm = world()
    g, _ = shuffled_communities(k=8, size=200, degree=10, cross=0.2, seed=4)
    g2, perm = reorder_nodes(g, method)
    assert np.array_equal(comm.bcast(perm), perm)  # every rank relabels alike
    cfg = TrainConfig(dataset="communities", model=model, epochs=6, backend="cpu", ps=4, dist=2, wpb=2,
                      progress=False, dropout=0.0, reorder_nodes="none")
    ref = train(cfg, Communicator(comm=None), g)  # one rank, input order
    res = train(cfg, comm, g2)
    want = np.array([e["loss"] for e in ref.epochs])
    got = np.array([e["loss"] for e in res.epochs])
    diff = comm.allreduce_scalar(float(np.abs(got - want).max() / np.abs(want).max()), "max")
    print(f"{model}/{method} P={comm.size}: max relative loss difference {diff:.2e}")
    assert diff < 2e-5
