"""ShardedEmbeddingBag on one process: torch.nn.EmbeddingBag equivalence, gradients, optimizers, errors."""
import numpy as np
import pytest
import torch

from mgg.embedding import (MultiTableEmbeddingBag, RowWiseAdagrad, ShardedEmbeddingBag, SparseSGD, TableConfig,
                           TableLayout, init_rows, init_table)
from mgg.runtime import world
from mgg.runtime.comm import RankError

N, D = 300, 6


@pytest.fixture(scope="module")
def comm():
    return world(use_mpi=False) if world().size == 1 else world()


def batch(seed, n=60, bags=9, empty=True, n_rows=N):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_rows, (n,), generator=g)
    cuts = torch.sort(torch.randint(0, n + 1, (bags - 1,), generator=g)).values
    off = torch.cat([torch.tensor([0]), cuts])
    if empty:
        off[2] = off[3] = off[1]  # consecutive empty bags
    return idx, off


def reference(mode, ilo=False, seed=0, init="normal"):
    w = init_table(N, D, seed=seed, kind=init)
    return torch.nn.EmbeddingBag.from_pretrained(w, freeze=False, mode=mode, include_last_offset=ilo)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("ilo", [False, True])
@pytest.mark.parametrize("psw", [False, True])
def test_forward_backward_equal_torch(comm, mode, ilo, psw):
    if psw and mode != "sum":
        pytest.skip("per_sample_weights only with sum")
    emb = ShardedEmbeddingBag(N, D, mode, comm=comm, include_last_offset=ilo, seed=5)
    ref = reference(mode, ilo, seed=5)
    idx, off = batch(1)
    if ilo:
        off = torch.cat([off, torch.tensor([len(idx) - 3])])  # indices after the last offset are ignored
    w = torch.rand(len(idx), requires_grad=True) if psw else None
    w2 = w.detach().clone().requires_grad_(True) if psw else None
    out = emb(idx, off, w)
    end = int(off[-1]) if ilo else len(idx)  # torch leaves the gradient of ignored trailing indices uninitialized
    rout = ref(idx[:end], off, None if w2 is None else w2[:end])
    assert torch.equal(out, rout)
    assert (out[2] == 0).all()  # empty bag -> zeros
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (rout * g).sum().backward()
    dense = emb.gather_gradient(emb.reduce_gradients())[0]
    torch.testing.assert_close(dense, ref.weight.grad, rtol=0, atol=1e-6)
    if psw:
        torch.testing.assert_close(w.grad, w2.grad)
    emb.free()


def test_2d_input_and_numpy_and_eval(comm):
    emb = ShardedEmbeddingBag(N, D, "sum", comm=comm, seed=2)
    ref = reference("sum", seed=2)
    x = torch.randint(0, N, (7, 4))
    assert torch.equal(emb(x), ref(x))
    idx, off = batch(3)
    assert torch.equal(emb(idx.numpy(), off.numpy()), ref(idx, off))
    assert torch.equal(emb(idx.tolist(), off.tolist()), ref(idx, off))
    emb.eval()
    with torch.no_grad():
        assert torch.equal(emb(idx, off), ref(idx, off))
    assert not emb._pending
    emb.free()


def test_init_is_layout_independent():
    full = init_table(200_000, 3, seed=9)  # several init blocks
    rows = np.array([199_999, 5, 70_000, 65_536, 65_535, 5])
    assert torch.equal(init_rows(rows, 200_000, 3, seed=9), full[rows])
    u = init_table(1000, 4, seed=1, kind="uniform")
    assert u.abs().max() <= np.sqrt(1 / 1000)
    assert not torch.equal(init_table(10, 2, seed=1), init_table(10, 2, seed=2))


def test_layout_roundtrip():
    lay = TableLayout((10, 7, 1), ("range", "hash", "range"), 3)
    for pe in range(3):
        for t in range(3):
            rows, local = lay.owned_rows(t, pe)
            own, loc2 = lay.locate(t, rows)
            assert (own == pe).all() and (loc2 == local).all()
            tab, back = lay.keys_of_local(pe, local)
            assert (tab == t).all() and (back == rows).all()
    owned = np.concatenate([lay.owned_rows(1, pe)[0] for pe in range(3)])
    assert sorted(owned) == list(range(7))
    assert lay.rows_per_pe == 4 + 3 + 1


def _ref_rowwise_adagrad(w, s, g, lr, eps):
    touched = (g != 0).any(1)
    s = s.clone()
    s[touched] += (g[touched] ** 2).mean(1)
    w = w.clone()
    w[touched] -= lr * g[touched] / (s[touched].sqrt() + eps).unsqueeze(1)
    return w, s


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_optimizers_equal_reference(comm, opt):
    emb = ShardedEmbeddingBag(N, D, "mean", comm=comm, seed=4)
    w = init_table(N, D, seed=4)
    s = torch.zeros(N)
    o = SparseSGD(emb, lr=0.5) if opt == "sgd" else RowWiseAdagrad(emb, lr=0.3, eps=1e-8)
    for step in range(3):
        idx, off = batch(10 + step)
        ref = torch.nn.EmbeddingBag.from_pretrained(w.clone(), freeze=False, mode="mean")
        target = torch.randn(len(off), D)
        ((emb(idx, off) - target) ** 2).sum().backward()
        ((ref(idx, off) - target) ** 2).sum().backward()
        o.step()
        g = ref.weight.grad
        if opt == "sgd":
            w = w - 0.5 * g
        else:
            w, s = _ref_rowwise_adagrad(w, s, g, 0.3, 1e-8)
        torch.testing.assert_close(emb.weight(), w, rtol=1e-6, atol=1e-6)
    emb.free()


def test_multitable_equals_separate_tables(comm):
    cfgs = [TableConfig(50, 4, "sum", "range", "a"), TableConfig(80, 6, "max", "hash", "b"),
            TableConfig(20, 6, "mean", "range", "c")]
    m = MultiTableEmbeddingBag(cfgs, comm, seed=7)
    refs = [torch.nn.EmbeddingBag.from_pretrained(init_table(c.num_embeddings, c.embedding_dim, seed=7 + t), freeze=False,
                                                  mode=c.mode) for t, c in enumerate(cfgs)]
    ins = [batch(20 + t, n_rows=c.num_embeddings) for t, c in enumerate(cfgs)]
    outs = m([i for i, _ in ins], [o for _, o in ins])
    loss = sum(o.square().sum() for o in outs)
    loss.backward()
    sum(r(i, o).square().sum() for r, (i, o) in zip(refs, ins)).backward()
    grads = m.gather_gradient(m.reduce_gradients())
    for t, r in enumerate(refs):
        assert torch.equal(outs[t], r(*ins[t]))
        torch.testing.assert_close(grads[t], r.weight.grad, rtol=0, atol=1e-6)
    assert m([None, ins[1][0], None], [None, ins[1][1], None])[0] is None
    m.free()


def test_weights_from_array(comm):
    w = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    emb = ShardedEmbeddingBag(40, 3, "sum", "hash", comm=comm, weight=w)
    assert np.array_equal(emb.weight().numpy(), w)
    with pytest.raises(ValueError, match="shape"):
        ShardedEmbeddingBag(41, 3, comm=comm, weight=w)
    emb.free()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_row(comm, bad):
    """A table whose given weights hold NaN or infinity is refused at construction (on every rank:
    the error is agreed, whichever rank owns the row), nothing allocated stays behind."""
    w = np.random.default_rng(1).standard_normal((40, 3)).astype(np.float32)
    w[17, 1] = bad
    with pytest.raises((ValueError, RankError), match="row 17 holds NaN or infinity"):
        ShardedEmbeddingBag(40, 3, "sum", "hash", comm=comm, weight=w)
    emb = ShardedEmbeddingBag(40, 3, "sum", "hash", comm=comm, weight=np.nan_to_num(w, posinf=0.0))
    emb.free()


@pytest.mark.parametrize("args,exc,msg", [
    ((torch.tensor([0, 300]), torch.tensor([0])), IndexError, "out of range"),
    ((torch.tensor([0, -1]), torch.tensor([0])), IndexError, "out of range"),
    ((torch.tensor([0, 1, 2]), torch.tensor([1, 2])), ValueError, "start at 0"),
    ((torch.tensor([0, 1, 2]), torch.tensor([0, 2, 1])), ValueError, "non-decreasing"),
    ((torch.tensor([0, 1, 2]), torch.tensor([0, 4])), ValueError, "exceeds len"),
    ((torch.tensor([0, 1, 2]), torch.tensor([], dtype=torch.int64)), ValueError, "0 bags"),
    ((torch.tensor([0.0, 1.0]), torch.tensor([0])), TypeError, "integer"),
    ((torch.tensor([0, 1]), torch.tensor([0.0])), TypeError, "integer"),
    ((torch.tensor([[0, 1]]), torch.tensor([0])), ValueError, "1-D"),
    ((torch.tensor([0, 1]), None), ValueError, "2-D"),
    ((torch.tensor([0, 1]), torch.tensor([0]), torch.ones(3)), ValueError, "per_sample_weights"),
    ((torch.tensor([0, 1]), torch.tensor([0]), torch.ones(2, dtype=torch.int64)), TypeError, "floating"),
    (([0, [1, 2]], [0]), ValueError, "ragged"),
    ((["a"], [0]), TypeError, "numbers"),
])
def test_bad_inputs_raise_clear_errors(comm, args, exc, msg):
    emb = ShardedEmbeddingBag(N, D, "sum", comm=comm)
    with pytest.raises(exc, match=msg):
        emb(*args)
    emb.free()


def test_empty_offsets_are_zero_bags_and_own_no_ids():
    """offsets=[] with no ids is a valid empty batch; the normalized offsets start at 0 and end at
    len(indices), so batches formed by concatenation give every id to its own input's bag."""
    from mgg.embedding.validate import check_bag_input
    b = check_bag_input(torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), None,
                        num_embeddings=10, mode="sum", include_last_offset=False)
    assert b.num_bags == 0 and b.offsets.tolist() == [0]
    for idx, off, ilo in (([1, 2, 3], [0, 1], False), ([1, 2, 3], [0, 1, 2], True), ([4], [0], False)):
        b = check_bag_input(torch.tensor(idx), torch.tensor(off), None, num_embeddings=10, mode="sum",
                            include_last_offset=ilo)
        assert int(b.offsets[0]) == 0 and int(b.offsets[-1]) == b.indices.numel()


def test_bad_config(comm):
    with pytest.raises(ValueError, match="per_sample_weights are only supported"):
        e = ShardedEmbeddingBag(N, D, "mean", comm=comm)
        try:
            e(torch.tensor([1]), torch.tensor([0]), torch.ones(1))
        finally:
            e.free()
    with pytest.raises(ValueError, match="mode"):
        ShardedEmbeddingBag(N, D, "median", comm=comm)
    with pytest.raises(ValueError, match="sharding"):
        ShardedEmbeddingBag(N, D, "sum", "round", comm=comm)
    with pytest.raises(ValueError, match="num_embeddings"):
        ShardedEmbeddingBag(0, D, comm=comm)
    with pytest.raises(ValueError, match="lr"):
        e = ShardedEmbeddingBag(N, D, comm=comm)
        try:
            SparseSGD(e, lr=0)
        finally:
            e.free()


def test_open_table_probes_the_format(tmp_path):
    """open_table: .npy needs NumPy's header; safetensors is recognised by its bytes whatever the
    suffix; anything else gets one clear line."""
    from mgg.embedding.io import open_table, save_safetensors

    W = np.arange(12, dtype=np.float32).reshape(4, 3)
    save_safetensors(str(tmp_path / "w.bin"), {"weight": W})
    np.testing.assert_array_equal(np.asarray(open_table(TableConfig(None, None, name="w", path=str(tmp_path / "w.bin")))), W)
    np.save(tmp_path / "w.npy", W)
    np.testing.assert_array_equal(np.asarray(open_table(TableConfig(None, None, name="w", path=str(tmp_path / "w.npy")))), W)
    junk = b"junk junk junk junk junk junk\n" * 3
    (tmp_path / "junk.npy").write_bytes(junk)
    with pytest.raises(ValueError, match=r"junk\.npy is not a \.npy file"):
        open_table(TableConfig(None, None, name="j", path=str(tmp_path / "junk.npy")))
    (tmp_path / "junk.dat").write_bytes(junk)
    with pytest.raises(ValueError, match="neither .npy nor safetensors"):
        open_table(TableConfig(None, None, name="j", path=str(tmp_path / "junk.dat")))
    (tmp_path / "junk.safetensors").write_bytes(junk)  # the suffix promises safetensors: its error
    with pytest.raises(ValueError, match="bad safetensors header"):
        open_table(TableConfig(None, None, name="j", path=str(tmp_path / "junk.safetensors")))


def test_one_table_descriptor_for_modules_and_tables_json(comm, tmp_path):
    """tables.json entries and module tables are the same TableConfig: one default mode ("sum"),
    the file-backed one gets its shape from the file, a shapeless one is refused by the module."""
    import json

    from mgg.embedding.io import load_tables_json, open_table

    assert TableConfig(5, 2).mode == "sum" and TableConfig(5, 2, "mean").mode == "mean"
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "a.npy", w)
    (tmp_path / "t.json").write_text(json.dumps([{"name": "a", "path": "a.npy"},
                                                 {"name": "b", "path": "a.npy", "mode": "max", "sharding": "hash"}]))
    a, b = load_tables_json(str(tmp_path / "t.json"))
    assert isinstance(a, TableConfig) and (a.mode, a.sharding, a.num_embeddings) == ("sum", "range", None)
    assert (b.mode, b.sharding) == ("max", "hash") and a.path == str(tmp_path / "a.npy")
    with pytest.raises(ValueError, match="unknown"):
        MultiTableEmbeddingBag([a], comm)
    arr = open_table(a)
    shaped = a.with_shape(*arr.shape)
    assert (shaped.num_embeddings, shaped.embedding_dim, shaped.name) == (4, 3, "a")
    emb = MultiTableEmbeddingBag([shaped], comm, weights=[arr])
    out = emb([torch.tensor([0, 3, 1])], [torch.tensor([0, 2])])[0]  # default mode sum: rows 0+3, row 1
    assert torch.equal(out, torch.from_numpy(np.stack([w[0] + w[3], w[1]])))
    emb.free()
    with pytest.raises(ValueError, match="without a path"):
        TableConfig(None, None, name="x")
