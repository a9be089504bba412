"""mgg.nn.epilogue on one CPU process: a hidden GCN layer's bias, ReLU and the next layer's input
dropout as one Epilogue give what the layer-by-layer model gives (the same seeds, drawn in the
same order), against a loop written out with global_dropout and against float64 dense math.
The fused GPU kernels: tests/nn/test_epilogue_gpu.py."""
import numpy as np
import pytest
import torch

from mgg.nn import build_model, global_dropout
from mgg.nn.epilogue import Epilogue, apply_epilogue
from mgg.nn.functional import hash_uniform_host
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig
from mgg.testing.reference import aggregation_matrix
from mgg.testing.graphs import random_csr


def _dg(n=60, e=300, seed=3):
    indptr, indices = random_csr(n, e, seed=seed)
    dg = DistGraph(indptr, indices, Communicator(comm=None), RuntimeConfig(ps=4, dist=2, wpb=2, backend="cpu"))
    return dg, indptr, indices


def _written_out(model, x, dg, gen):
    """The GNN's forward layer by layer: dropout -> conv -> ReLU (none after the last)."""
    for i, conv in enumerate(model.convs):
        x = conv(global_dropout(x, model.dropout, dg, gen, model.training), dg)
        if i < len(model.convs) - 1:
            x = torch.relu(x)
    return x


@pytest.mark.parametrize("layers,hidden", [(2, 8), (3, 8), (3, 16)])
@pytest.mark.parametrize("training", [True, False])
def test_gcn_with_epilogues_is_the_written_out_model(layers, hidden, training):
    dg, _, _ = _dg()
    torch.manual_seed(0)
    x = torch.randn(dg.n_local, 12)
    m = build_model("gcn", 12, hidden, 5, layers, 0.5)
    m.train(training)
    m.cache_input_aggregation = False  # (the cache aggregates before the first Linear: other rounding)
    outs, grads = _three_ways(m, x, dg, layers, training)
    for o, g in zip(outs[1:], grads[1:]):
        assert torch.equal(outs[0], o)
        for a, b in zip(grads[0], g):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _three_ways(m, x, dg, layers: int, training: bool) -> tuple[list, list]:
    """Model m's logits and parameter gradients (of the logits' square sum) with its epilogues,
    without them, and written out layer by layer, each from generator seed 4; and that each
    forward drew its seeds in the same order."""
    outs, grads = [], []
    for fuse in (True, False, None):
        m.fuse_epilogue = bool(fuse)
        m.zero_grad()
        gen = torch.Generator().manual_seed(4)
        out = _written_out(m, x, dg, gen) if fuse is None else m(x, dg, gen)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in m.parameters()])
        assert torch.randint(0, 2 ** 62, (1,), generator=gen).item() == draws_after(layers, training)
    return outs, grads


def draws_after(layers: int, training: bool) -> int:
    """The generator's next value after one forward: one seed per layer when training."""
    gen = torch.Generator().manual_seed(4)
    for _ in range(layers if training else 0):
        torch.randint(0, 2 ** 62, (1,), generator=gen)
    return torch.randint(0, 2 ** 62, (1,), generator=gen).item()


def test_apply_epilogue_matches_float64_math():
    """relu(h + b), the hash mask of rows row0 .. for the seed, / (1 - p), times row_scale."""
    torch.manual_seed(1)
    h = torch.randn(50, 6, dtype=torch.float64)
    b = torch.randn(6, dtype=torch.float64)
    s = torch.rand(50, dtype=torch.float64) + 0.5
    seed, row0, p = 2 ** 40 + 3, 17, 0.3
    keep = (hash_uniform_host(row0, 50, 6, seed) >= p).double()
    ref = torch.relu(h + b) * keep / (1 - p) * s[:, None]
    torch.testing.assert_close(apply_epilogue(h, b, Epilogue(p, seed, row0, s)), ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(apply_epilogue(h, None, Epilogue(0.0, None, 0, s)), torch.relu(h) * s[:, None])


def test_two_layer_gcn_eval_matches_dense_float64():
    """Eval (no dropout): the epilogue's ReLU between two GCN layers, against dense float64."""
    dg, indptr, indices = _dg(seed=5)
    w_hat = aggregation_matrix(indptr, indices, "gcn").toarray()
    torch.manual_seed(2)
    m = build_model("gcn", 12, 8, 4, 2, 0.5).double().eval()
    m.cache_input_aggregation = False
    x = torch.randn(dg.n_local, 12, dtype=torch.float64)
    c1, c2 = m.convs
    h = np.maximum(w_hat @ (x.numpy() @ c1.lin.weight.detach().numpy().T) + c1.bias.detach().numpy(), 0.0)
    ref = w_hat @ h @ c2.lin.weight.detach().numpy().T + c2.bias.detach().numpy()
    # (the plan holds the gcn weights in float32: 1e-7 relative)
    np.testing.assert_allclose(m(x, dg).detach().numpy(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hidden", [4, 16])  # 4 < in 12: projected before the mean; 16: after
@pytest.mark.parametrize("training", [True, False])
def test_sage_with_epilogues_is_the_written_out_model(hidden, training):
    """SAGEConv takes the hidden layers' Epilogue (the root term by addmm, then bias, ReLU and the
    next dropout): the layer-by-layer model's values and gradients within float32 rounding (the
    sum's order differs), the same seeds drawn."""
    dg, _, _ = _dg(seed=5)
    torch.manual_seed(1)
    x = torch.randn(dg.n_local, 12)
    m = build_model("sage", 12, hidden, 5, 3, 0.5)
    m.train(training)
    m.cache_input_aggregation = False
    outs, grads = _three_ways(m, x, dg, 3, training)
    for o, g in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(outs[0], o, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads[0], g):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_sage_takes_the_epilogue_from_its_cached_input_aggregation():
    """Eval with the input cache: the first SAGE layer starts from mean(x) (forward_aggregated) and
    still runs its epilogue; the logits are those without the cache and without the epilogue."""
    dg, _, _ = _dg(seed=6)
    torch.manual_seed(2)
    x = torch.randn(dg.n_local, 12)
    m = build_model("sage", 12, 16, 5, 2, 0.5).eval()
    called = []
    conv = m.convs[0]
    real = conv._epilogue
    conv._epilogue = lambda *a: called.append(1) or real(*a)
    with torch.no_grad():
        cached = m(x, dg)
        m.cache_input_aggregation, m.fuse_epilogue = False, False
        plain = m(x, dg)
    assert m.input_cache.builds == 1 and called == [1]
    torch.testing.assert_close(cached, plain, rtol=1e-5, atol=1e-6)
