"""mgg.nn on one process: Aggregate's gradient, each layer against a dense float64 formula."""
import numpy as np
import pytest
import torch

from mgg.nn import GCNConv, GINConv, SAGEConv, aggregate, build_model, global_dropout, model_names
from mgg.runtime import Communicator
from mgg.testing.dist_graphs import single_rank_graph
from mgg.testing.reference import dense_aggregation_matrix
from mgg.testing.tensors import leaf


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
@pytest.mark.parametrize("seed", [0, 1])
def test_aggregate_gradcheck(kind, seed):
    dg, indptr, indices = single_rank_graph(n=25, e=90, seed=seed)
    x = torch.randn(dg.n_local, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: aggregate(t, dg, kind), (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("kind", ["sum", "mean", "gcn", "sum_self"])
def test_aggregate_forward_backward_match_dense(kind):
    dg, indptr, indices = single_rank_graph(seed=3)
    w = dense_aggregation_matrix(indptr, indices, kind)
    x = torch.randn(dg.n_local, 5, requires_grad=True)
    g = torch.randn(dg.n_local, 5)
    out = aggregate(x, dg, kind)
    out.backward(g)
    assert torch.allclose(out.double(), w @ x.double(), atol=1e-5)
    assert torch.allclose(x.grad.double(), w.T @ g.double(), atol=1e-5)


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_gcn_conv_dense(fin, fout):
    dg, indptr, indices = single_rank_graph(seed=4)
    conv = GCNConv(fin, fout)
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(dg.n_local, fin)
    w = dense_aggregation_matrix(indptr, indices, "gcn")
    ref = w @ x.double() @ conv.lin.weight.double().T + conv.bias.double()
    assert torch.allclose(conv(x, dg).double(), ref, atol=1e-5)


def test_gin_conv_dense_and_eps_grad():
    dg, indptr, indices = single_rank_graph(seed=5)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    conv = GINConv(mlp, eps=0.3, train_eps=True)
    x = torch.randn(dg.n_local, 4)
    out = conv(x, dg)
    w = dense_aggregation_matrix(indptr, indices, "sum")
    h = 1.3 * x.double() + w @ x.double()
    ref = mlp.double()(h)
    mlp.float()
    assert torch.allclose(out.double(), ref, atol=1e-4)
    out.square().sum().backward()
    assert conv.eps.grad is not None and conv.eps.grad.abs().item() > 0


def test_gin_fixed_eps_is_buffer():
    conv = GINConv(torch.nn.Linear(2, 2), eps=0.1, train_eps=False)
    assert "eps" not in dict(conv.named_parameters())


@pytest.mark.parametrize("eps", [0.0, 0.375])
def test_gin_fixed_eps_float64_and_loaded_eps(eps):
    """A fixed eps (a buffer): (A + I) x through the sum_self kind, plus eps x when eps != 0, equals
    (1 + eps) x + A x in float64; an eps loaded from a state dict is the one used afterwards.
    (eps is created float32, as torch's buffers are: 0.375 is exact there. 0.4 became
    0.40000000596 after .double(), 1.7e-8 off here, which failed atol=1e-10 whenever an output
    element was near 0 and allclose's default rtol no longer covered it.)"""
    dg, indptr, indices = single_rank_graph(seed=6)
    x = torch.randn(dg.n_local, 5, dtype=torch.float64)
    a = dense_aggregation_matrix(indptr, indices, "sum")
    conv = GINConv(torch.nn.Identity(), eps=eps).double()
    torch.testing.assert_close(conv(x, dg), (1 + eps) * x + a @ x, rtol=0, atol=1e-12)
    other = GINConv(torch.nn.Identity(), eps=0.0).double()
    other.load_state_dict(conv.state_dict())
    torch.testing.assert_close(other(x, dg), (1 + eps) * x + a @ x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_sage_conv_dense(fin, fout):
    dg, indptr, indices = single_rank_graph(seed=6)
    conv = SAGEConv(fin, fout)
    x = torch.randn(dg.n_local, fin)
    w = dense_aggregation_matrix(indptr, indices, "mean")
    xd = x.double()
    ref = (w @ xd) @ conv.lin_l.weight.double().T + conv.lin_l.bias.double() + xd @ conv.lin_r.weight.double().T
    assert torch.allclose(conv(x, dg).double(), ref, atol=1e-5)


@pytest.mark.parametrize("name", model_names())  # every registered model
def test_models_backward_reaches_every_parameter(name):
    dg, _, _ = single_rank_graph(seed=7)
    model = build_model(name, 5, 8, 3, layers=None, dropout=0.5)
    gen = torch.Generator().manual_seed(0)
    out = model(torch.randn(dg.n_local, 5), dg, gen)
    assert out.shape == (dg.n_local, 3)
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname


def test_global_dropout_is_partition_independent():
    dg, _, _ = single_rank_graph(n=30)
    x = torch.ones(dg.n_local, 4)
    a = global_dropout(x, 0.5, dg, torch.Generator().manual_seed(1))
    b = global_dropout(x, 0.5, dg, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(global_dropout(x, 0.5, dg, None, training=False), x)


def test_build_model_rejects_unknown():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("foo", 3, 4, 2)


# -- narrow side (GIN's first Linear before the sum, SAGE's projection before the mean) ----------

@pytest.mark.parametrize("fin,hidden", [(6, 3), (3, 6), (4, 4)])
def test_gin_conv_both_orders_match_dense_float64_with_grads(fin, hidden):
    torch.manual_seed(fin * 10 + hidden)
    dg, indptr, indices = single_rank_graph(seed=8)
    mlp = torch.nn.Sequential(torch.nn.Linear(fin, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)).double()
    conv = GINConv(mlp, eps=0.25, train_eps=True).double()
    assert conv.projects_first == (hidden < fin)
    x = torch.randn(dg.n_local, fin, dtype=torch.float64, requires_grad=True)
    g = torch.randn(dg.n_local, 2, dtype=torch.float64)
    conv(x, dg).backward(g)
    # independent reference: dense adjacency, the sum first, the MLP written out
    a = dense_aggregation_matrix(indptr, indices, "sum")
    xr, w1, b1, w2, b2, eps = (leaf(t) for t in (x, mlp[0].weight, mlp[0].bias, mlp[2].weight,
                                                  mlp[2].bias, conv.eps))
    h = (1 + eps) * xr + a @ xr
    ref = torch.relu(h @ w1.T + b1) @ w2.T + b2
    ref.backward(g)
    out = conv(x.detach(), dg)
    assert torch.allclose(out, ref, atol=1e-10)
    for got, want in ((x.grad, xr.grad), (mlp[0].weight.grad, w1.grad), (mlp[0].bias.grad, b1.grad),
                      (mlp[2].weight.grad, w2.grad), (conv.eps.grad, eps.grad)):
        assert torch.allclose(got, want, atol=1e-10)


def test_gin_conv_narrow_gradcheck():
    dg, _, _ = single_rank_graph(n=20, e=70, seed=9)
    mlp = torch.nn.Sequential(torch.nn.Linear(5, 2), torch.nn.ReLU(), torch.nn.Linear(2, 3)).double()
    conv = GINConv(mlp, eps=0.1, train_eps=True).double()
    assert conv.projects_first
    x = torch.randn(dg.n_local, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: conv(t, dg), (x,), eps=1e-6, atol=1e-5)


def test_gin_conv_single_linear_projects_first():
    dg, indptr, indices = single_rank_graph(seed=10)
    lin = torch.nn.Linear(6, 2).double()
    conv = GINConv(lin, eps=0.0).double()
    assert conv.projects_first
    x = torch.randn(dg.n_local, 6, dtype=torch.float64)
    ref = (x + dense_aggregation_matrix(indptr, indices, "sum") @ x) @ lin.weight.T + lin.bias
    assert torch.allclose(conv(x, dg), ref, atol=1e-10)


@pytest.mark.parametrize("fin,fout", [(6, 3), (3, 6)])
def test_sage_conv_both_orders_grads_float64(fin, fout):
    torch.manual_seed(fin)
    dg, indptr, indices = single_rank_graph(seed=11)
    conv = SAGEConv(fin, fout).double()
    x = torch.randn(dg.n_local, fin, dtype=torch.float64, requires_grad=True)
    g = torch.randn(dg.n_local, fout, dtype=torch.float64)
    conv(x, dg).backward(g)
    w = dense_aggregation_matrix(indptr, indices, "mean")
    xr, wl, bl, wr = (leaf(t) for t in (x, conv.lin_l.weight, conv.lin_l.bias, conv.lin_r.weight))
    ref = (w @ xr) @ wl.T + bl + xr @ wr.T
    ref.backward(g)
    assert torch.allclose(conv(x.detach(), dg), ref, atol=1e-10)
    for got, want in ((x.grad, xr.grad), (conv.lin_l.weight.grad, wl.grad), (conv.lin_l.bias.grad, bl.grad),
                      (conv.lin_r.weight.grad, wr.grad)):
        assert torch.allclose(got, want, atol=1e-10)


# -- DistBatchNorm and GIN's norm ---------------------------------------------------------------

def test_dist_batch_norm_matches_torch_batchnorm1d():
    from mgg.nn.norm import DistBatchNorm

    dg, _, _ = single_rank_graph(seed=12)
    torch.manual_seed(0)
    ours, ref = DistBatchNorm(5).double(), torch.nn.BatchNorm1d(5).double()
    with torch.no_grad():
        for m in (ours, ref):
            m.weight.copy_(torch.linspace(0.5, 2.0, 5))
            m.bias.copy_(torch.linspace(-1.0, 1.0, 5))
    for step in range(3):
        x = (torch.randn(dg.n_local, 5, dtype=torch.float64) * 3 + step).requires_grad_(True)
        xr = leaf(x)
        g = torch.randn(dg.n_local, 5, dtype=torch.float64)
        out, want = ours(x, dg), ref(xr)
        out.backward(g)
        want.backward(g)
        assert torch.allclose(out, want, atol=1e-10)
        assert torch.allclose(x.grad, xr.grad, atol=1e-10)
        assert torch.allclose(ours.weight.grad, ref.weight.grad, atol=1e-10)
        assert torch.allclose(ours.bias.grad, ref.bias.grad, atol=1e-10)
    assert torch.allclose(ours.running_mean, ref.running_mean, atol=1e-12)
    assert torch.allclose(ours.running_var, ref.running_var, atol=1e-12)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    ours.eval()
    ref.eval()
    x = torch.randn(dg.n_local, 5, dtype=torch.float64)
    assert torch.allclose(ours(x, dg), ref(x), atol=1e-12)


def test_dist_batch_norm_gradcheck_and_bad_input():
    from mgg.nn.norm import DistBatchNorm, make_norm

    bn = DistBatchNorm(3).double()
    x = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: bn(t, None), (x,), eps=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="expected"):
        bn(torch.randn(4, 2, dtype=torch.float64), None)
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("group", 4)


@pytest.mark.parametrize("norm", ["batch", "layer", "none"])
def test_gin_norm_option_builds_and_trains_every_parameter(norm):
    from mgg.nn import GIN
    from mgg.nn.norm import DistBatchNorm

    dg, _, _ = single_rank_graph(seed=13)
    model = GIN(5, 8, 3, layers=2, dropout=0.0, norm=norm)
    kinds = [type(m) for m in model.modules()]
    assert (DistBatchNorm in kinds) == (norm == "batch")
    assert (torch.nn.LayerNorm in kinds) == (norm == "layer")
    out = model(torch.randn(dg.n_local, 5), dg)
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
    with pytest.raises(ValueError, match="norm must be one of"):
        GIN(5, 8, 3, norm="batchnorm")


# -- partition-independent dropout: the counter hash on local rows ------------------------------

@pytest.mark.parametrize("row0,n,cols,seed", [(0, 50, 7, 1), (123, 40, 64, 2 ** 61 + 12345),
                                              (2 ** 32 - 3, 6, 5, 2 ** 40 + 7), (9, 0, 3, 5)])
def test_hash_uniform_host_is_hash_uniform_bit_for_bit(row0, n, cols, seed):
    from mgg.nn.functional import hash_uniform, hash_uniform_host

    want = hash_uniform(torch.arange(row0, row0 + n, dtype=torch.int64), cols, seed)
    got = hash_uniform_host(row0, n, cols, seed)
    assert got.dtype == torch.float32 and got.shape == (n, cols)
    assert torch.equal(got, want)


class _Rows:
    """A DistGraph stand-in for global_dropout: rank rows start at global id `lo`."""

    def __init__(self, lo):
        self.lo = lo


def test_global_dropout_cpu_is_the_hash_mask_of_local_rows():
    from mgg.nn.functional import hash_dropout_reference

    x = torch.randn(30, 6)
    whole = global_dropout(x, 0.3, _Rows(0), torch.Generator().manual_seed(4))
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=torch.Generator().manual_seed(4)).item())
    assert torch.equal(whole, hash_dropout_reference(x, 0.3, seed, 0))
    # any split of the rows drops the same entries (each part only hashes its own rows)
    parts = [global_dropout(x[a:b], 0.3, _Rows(a), torch.Generator().manual_seed(4))
             for a, b in ((0, 11), (11, 11), (11, 30))]
    assert torch.equal(torch.cat(parts), whole)
    kept = (whole != 0).double().mean().item()
    assert 0.6 < kept < 0.8


def test_global_dropout_draws_one_seed_per_call():
    # an empty rank draws its seed too, so every rank's generator stays in step
    g = torch.Generator().manual_seed(5)
    global_dropout(torch.zeros(0, 4), 0.5, _Rows(7), g)
    ref = torch.Generator().manual_seed(5)
    torch.randint(0, 2 ** 62, (1,), generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())


@pytest.mark.slow
@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="needs nvcc")
def test_dropout_kernel_compiles(kernel_cache_dir, monkeypatch):
    import os

    from mgg.kernels.dropout_gpu import build

    monkeypatch.setenv("MGG_KERNEL_CACHE", str(kernel_cache_dir))
    path = build("sm_90")
    assert os.path.getsize(path) > 0 and path.startswith(str(kernel_cache_dir))
    assert build("sm_90") == path  # cached


# -- GIN's defaults train -------------------------------------------------------------------------

def test_gin_defaults_train_sbm_as_well_as_gcn():
    # sbm at 2,000 nodes, 50 epochs: with the old defaults (no norm) GIN reached val 0.15 here
    # (0.29 on the 10,000-node CLI default) while GCN reaches 0.95. One seed's GIN varies by
    # about 0.1 (0.85-0.95), so the means over four seeds are compared.
    from mgg.data import load_dataset
    from mgg.train import TrainConfig, train

    g = load_dataset("sbm", scale=0.2, seed=0)
    val = {}
    for model in ("gcn", "gin"):
        accs = []
        for seed in range(4):
            cfg = TrainConfig(dataset="sbm", model=model, backend="cpu", epochs=50, eval_every=50, progress=False,
                              seed=seed)
            accs.append(train(cfg, Communicator(comm=None), g).epochs[-1]["val_acc"])
        val[model] = float(np.mean(accs))
    assert val["gcn"] > 0.9, val
    assert val["gin"] >= val["gcn"] - 0.06, val


def test_device_seeds_counter_state_and_mix():
    """DeviceSeeds (seeds of a step replayed from a CUDA graph): every draw is the counter plus
    one, from a start drawn like draw_seed's; the state round-trips; mix_seed is splitmix64's
    finaliser (reference values of the published algorithm: seed 0 -> first output of splitmix64
    is mix(0x9E3779B97F4A7C15))."""
    from mgg.nn.functional import DeviceSeeds, draw_seed, mix_seed

    start = draw_seed(torch.Generator().manual_seed(5))
    seeds = DeviceSeeds(torch.Generator().manual_seed(5), "cpu")
    a, b = draw_seed(seeds), draw_seed(seeds)
    assert (int(a), int(b)) == (start + 1, start + 2) and a.dtype == torch.int64
    state = seeds.get_state()
    c = int(seeds.draw())
    seeds.set_state(state)
    assert int(seeds.draw()) == c
    with pytest.raises(ValueError, match="uint8"):
        seeds.set_state(torch.zeros(3, dtype=torch.uint8))
    assert mix_seed(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF  # splitmix64(seed=0), first output
    assert mix_seed(2 ** 64 + 7) == mix_seed(7)


def test_device_seeds_need_cuda_rows():
    from mgg.nn.functional import DeviceSeeds, global_dropout

    class G:
        lo = 0

    with pytest.raises(TypeError, match="DeviceSeeds"):
        global_dropout(torch.ones(4, 3), 0.5, G(), DeviceSeeds(None, "cpu"))


def test_combine_rank_stats_is_the_float64_statistics_of_all_rows():
    """The several-GPU batch norm combines each rank's (mean, inverse std) with its row count:
    the result is the mean and biased variance of all rows (a rank without rows contributes
    nothing, whatever its placeholder entries)."""
    from mgg.nn.norm import combine_rank_stats

    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 6)) * s + c for n, s, c in ((50, 1.0, 3.0), (0, 1.0, 0.0), (7, 4.0, -2.0),
                                                                 (300, 0.1, 10.0))]
    eps = 1e-5
    means = torch.tensor(np.stack([p.mean(0) if len(p) else np.zeros(6) for p in parts]), dtype=torch.float32)
    invstd = torch.tensor(np.stack([1 / np.sqrt(p.var(0) + eps) if len(p) else np.ones(6) for p in parts]),
                          dtype=torch.float32)
    counts = torch.tensor([len(p) for p in parts], dtype=torch.float64)
    mean, var = combine_rank_stats(means, invstd, counts, float(counts.sum()), eps)
    rows = np.concatenate(parts)
    assert mean.dtype == torch.float64
    np.testing.assert_allclose(mean.numpy(), rows.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(var.numpy(), rows.var(0), rtol=2e-5, atol=1e-7)
