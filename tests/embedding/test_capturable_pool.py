"""mgg.embedding.capturable_pool (pooling with no host read, for a step replayed from a CUDA graph)
against torch's F.embedding_bag and a float64 reference: values and gradients (rows and per-sample
weights), "sum" and "mean", empty bags, include_last_offset; and train_lookup.pool with
capturable=True against its F.embedding_bag form, "max" refused."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mgg.embedding.capturable_pool import bag_of_ids, pool_bags
from mgg.embedding.device_input import DeviceBags
from mgg.embedding.train_lookup import RouteCache, pool
from mgg.kernels.embedding_gpu import TableGeometry


def _input(seed, n=80, rows=30, bags=12, dim=5, ilo=False, dtype=torch.float32):
    rng = np.random.default_rng(seed)
    w = torch.from_numpy(rng.standard_normal((rows, dim))).to(dtype)
    inv = torch.from_numpy(rng.integers(0, rows, n))
    off = np.sort(rng.integers(0, n - 3, bags))
    off[0] = 0
    off[3] = off[4] = off[2]  # empty bags
    off = torch.from_numpy(off)
    if ilo:
        off = torch.cat([off, torch.tensor([n - 3])])  # the last 3 ids belong to no bag
    psw = torch.from_numpy(rng.random(n)).to(dtype)
    return w, inv, off, psw


def _loss_grads(fn, w, psw):
    w = w.clone().requires_grad_(True)
    p = None if psw is None else psw.clone().requires_grad_(True)
    out = fn(w, p)
    scale = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / out.numel() - 0.3
    (out * scale).sum().backward()
    return out.detach(), w.grad, None if p is None else p.grad


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("sum", True), ("mean", False)])
@pytest.mark.parametrize("ilo", [False, True])
def test_pool_bags_equals_embedding_bag_values_and_gradients(mode, weighted, ilo):
    w, inv, off, psw = _input(1, ilo=ilo)
    psw = psw if weighted else None

    def ours(w_, p_):
        return pool_bags(w_, inv, off, mode, p_, include_last_offset=ilo)

    def torchs(w_, p_):
        if ilo:  # torch pools the ids after offsets[-1] into the last bag: drop them
            k = int(off[-1])
            return F.embedding_bag(inv[:k], w_, off, mode=mode, per_sample_weights=None if p_ is None else p_[:k],
                                   include_last_offset=True)
        return F.embedding_bag(inv, w_, off, mode=mode, per_sample_weights=p_)

    got = _loss_grads(ours, w, psw)
    want = _loss_grads(torchs, w, psw)
    ref = _loss_grads(torchs, w.double(), None if psw is None else psw.double())
    nb = len(off) - 1 if ilo else len(off)
    assert got[0].shape == (nb, w.shape[1]) and got[0].dtype == w.dtype
    assert (got[0][3] == 0).all()  # an empty bag is zero, also in mean mode
    if ilo and psw is not None:
        assert (got[2][-3:] == 0).all()  # the ids in no bag: weight gradient 0
    for g, t, r in zip(got, want, ref):
        if t is None:
            continue
        torch.testing.assert_close(g, t, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.double(), r, rtol=1e-5, atol=1e-6)


def test_bag_of_ids_and_edge_cases():
    off = torch.tensor([0, 0, 2, 2, 5])
    assert bag_of_ids(off, 7).tolist() == [1, 1, 3, 3, 3, 4, 4]  # empty bags 0 and 2 own no id
    assert bag_of_ids(off, 7, include_last_offset=True).tolist() == [1, 1, 3, 3, 3, 4, 4]
    assert bag_of_ids(torch.tensor([2, 3]), 4).tolist() == [0, 0, 0, 1]  # bad offsets: still in range
    out = pool_bags(torch.ones(3, 2), torch.zeros(0, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), "mean")
    assert out.shape == (4, 2) and (out == 0).all()
    with pytest.raises(ValueError, match="max"):
        pool_bags(torch.ones(3, 2), torch.zeros(2, dtype=torch.int64), torch.tensor([0]), "max")


def _groups(seed, mode="sum"):
    """Four tables of one width (two with weights) as DeviceBags over one slot vector."""
    rng = np.random.default_rng(seed)
    geometry, bags, n = [], [], 0
    for t in range(4):
        k, nb = int(rng.integers(5, 20)), int(rng.integers(2, 6))
        ids = torch.from_numpy(rng.integers(0, 10, k))
        off = torch.from_numpy(np.sort(rng.integers(0, k, nb)))
        off[0] = 0
        psw = torch.from_numpy(rng.random(k)).float() if t % 2 and mode == "sum" else None
        bags.append(DeviceBags(ids, off, nb, 0, psw, 0, 0, ()))
        geometry.append(TableGeometry(10, 10, 0, False, 1, 4, mode))
        n += k
    rng_rows = torch.from_numpy(rng.standard_normal((n + 1, 6))).float()
    inv = torch.from_numpy(rng.integers(0, n + 1, n))
    return rng_rows, inv, bags, geometry


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_grouped_pool_capturable_equals_embedding_bag(mode):
    rows, inv, bags, geometry = _groups(3, mode)
    present = list(range(len(bags)))
    outs = {}
    for capturable in (False, True):
        r = rows.clone().requires_grad_(True)
        o = pool(r, inv, bags, geometry, present, False, RouteCache(), capturable=capturable)
        sum((x * (i + 1.5)).sum() for i, x in enumerate(o)).backward()
        outs[capturable] = ([x.detach() for x in o], r.grad)
    for a, b in zip(outs[True][0], outs[False][0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[True][1], outs[False][1], rtol=1e-5, atol=1e-6)


def test_capturable_pool_refuses_max():
    rows, inv, bags, geometry = _groups(4)
    geometry = [TableGeometry(10, 10, 0, False, 1, 4, "max") for _ in geometry]
    with pytest.raises(ValueError, match="max"):
        pool(rows, inv, bags, geometry, list(range(len(bags))), False, RouteCache(), capturable=True)
