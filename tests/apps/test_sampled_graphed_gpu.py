"""A sampled SAGE / GCN step replayed from a CUDA graph over padded batches (mgg.apps.sampled_graphed)
trains the same weights as the eager step, batch after batch of different sizes, dropout on
(the seeds come from the same device counter in the same order), and a batch above the
capacities runs eagerly in between; with the features as gathered rows or as IndexedRows of the
table (the graph reads the table through its id buffer)."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from mgg.apps.sampled_graphed import PaddedStep, eager_step, padded_step  # noqa: E402
from mgg.nn import IndexedRows, SampledGCN, SampledSAGE  # noqa: E402
from mgg.nn.functional import DeviceSeeds  # noqa: E402
from mgg.nn.optim import Adam  # noqa: E402
from mgg.runtime import Communicator  # noqa: E402
from mgg.sample import sample_blocks  # noqa: E402
from mgg.sample.block import SampledBatch  # noqa: E402
from mgg.testing.graphs import random_csr  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


def batches(n=2000, count=9, fanouts=(6, 4), seed=0, indexed=False):
    indptr, indices = (torch.from_numpy(a).to(DEV) for a in random_csr(n, 12 * n, seed=seed))
    rng = np.random.default_rng(seed)
    x_all = torch.from_numpy(rng.standard_normal((n, 12)).astype(np.float32)).to(DEV)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        size = 64 if i != 6 else 200  # step 6 exceeds the capacities: eager
        seeds = torch.from_numpy(rng.choice(n, size, replace=False).astype(np.int64)).to(DEV)
        n_id, blocks = sample_blocks(indptr, indices, seeds, list(fanouts), gen)
        y = torch.from_numpy(rng.integers(0, 5, size).astype(np.int64)).to(DEV)
        x = IndexedRows(x_all, n_id) if indexed else x_all[n_id]
        out.append(SampledBatch(n_id=n_id, blocks=blocks, x=x, y=y, seeds=seeds))
    return out


@pytest.mark.parametrize("cls", [SampledSAGE, SampledGCN])
@pytest.mark.parametrize("indexed", [False, True])
def test_replayed_steps_train_the_eager_weights(cls, indexed):
    torch.manual_seed(0)
    eager_model = cls(12, 16, 5, layers=2, dropout=0.5).to(DEV)
    graph_model = cls(12, 16, 5, layers=2, dropout=0.5).to(DEV)
    graph_model.load_state_dict(eager_model.state_dict())
    comm = Communicator(comm=None)
    runs = []
    for model in (eager_model, graph_model):
        opt = Adam(model.parameters(), lr=0.01, weight_decay=5e-4, capturable=True)
        seeds = DeviceSeeds(torch.Generator().manual_seed(3), DEV)
        runs.append((model, opt, comm, None, seeds))
    step = PaddedStep(graph_model, lambda b: eager_step(*runs[1], b), lambda *a: padded_step(*runs[1], *a),
                      comm, warmup=2)
    for i, batch in enumerate(batches(indexed=indexed)):
        want = eager_step(*runs[0], batch)
        got = step(batch)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"loss of step {i}")
        for (name, p), q in zip(eager_model.named_parameters(), graph_model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"{name} after step {i}")
    assert step.captured, step.why_eager
    assert (step.replays, step.eager_steps) == (6, 3)
    # gathered rows are read where they lie (their address), indexed rows through their ids
    assert step.bufs.kind == ("ids" if indexed else "address")
