"""Label range checks (mgg.data.labels, mgg.apps.classes): the number of classes a run trains and
the labels it refuses, decided from shares of rows exactly as from the whole array."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from mgg.data import Graph, load_dataset
from mgg.data.labels import (DISTINCT_CAP, EMPTY_CLASSES_ALLOWED, num_classes_of, share_bounds,
                             summarize_share)
from mgg.runtime import Communicator
from mgg.train import TrainConfig, UserError, train

from mgg.testing.paths import ROOT
from mgg.testing.processes import subprocess_env as env

SOLO = Communicator(comm=None)


def reference(y: np.ndarray, limit=None):
    """The rule written out on the whole array: (classes, None) or (None, the refused row)."""
    below = np.flatnonzero(y < -1)
    if len(below):
        return None, int(below[0])
    if limit is not None:
        over = np.flatnonzero(y >= limit)
        return (None, int(over[0])) if len(over) else (limit, None)
    if (y < 0).all():
        return 1, None
    top, distinct = int(y.max()), len(set(y[y >= 0].tolist()))
    if top + 1 - distinct > max(EMPTY_CLASSES_ALLOWED, distinct):
        return None, int(np.flatnonzero(y == top)[0])
    return top + 1, None


def decide(y, parts, limit=None):
    shares = [summarize_share(y[lo:hi], lo, limit)
              for lo, hi in (share_bounds(len(y), r, parts) for r in range(parts))]
    try:
        return num_classes_of(shares, limit), None
    except ValueError as e:
        return None, str(e)


@pytest.mark.parametrize("seed", range(40))
def test_shares_decide_as_the_whole_array(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    classes = int(rng.integers(1, 40))
    y = rng.integers(0, classes, n)
    y[rng.random(n) < 0.2] = -1
    if seed % 4 == 1:  # a stray large label
        y[rng.integers(n)] = int(rng.integers(classes, 10**9))
    if seed % 8 == 3:
        y[rng.integers(n)] = int(rng.integers(-50, -1))
    limit = int(rng.integers(1, 60)) if seed % 3 == 2 else None
    want, row = reference(y, limit)
    for parts in (1, 2, 3, 7):
        got, err = decide(y, parts, limit)
        if want is not None:
            assert (got, err) == (want, None), (parts, y.tolist())
        else:
            assert got is None and err.startswith(f"y[{row}]={int(y[row])} "), (parts, err)


def test_the_boundary_of_empty_classes():
    few = np.array([0, 5])  # 6 classes, 4 empty: allowed (up to 16 may be empty)
    assert decide(few, 2) == (6, None)
    y = np.arange(20)  # 0..19 and one larger label L: 21 distinct, L - 20 classes empty
    top = 20 + max(EMPTY_CLASSES_ALLOWED, 21)  # exactly as many empty classes as allowed
    assert decide(np.append(y, top), 3) == (top + 1, None)
    _, err = decide(np.append(y, top + 1), 3)
    assert err == (f"y[20]={top + 1} implies {top + 2} classes, but only 21 distinct labels occur (the next "
                   f"largest is 19); fix the label, or give --num-classes {top + 2} to train {top + 2} classes")


def test_many_distinct_labels_are_taken_as_given():
    y = np.arange(0, 4 * (DISTINCT_CAP + 1), 4)  # thousands of classes, three quarters empty
    assert decide(y, 1) == (int(y.max()) + 1, None)


def test_tensors_memory_maps_and_other_dtypes(tmp_path):
    y = np.array([0, 3, -1, 2, 100000], dtype=np.int32)
    assert decide(torch.from_numpy(y), 2)[1].startswith("y[4]=100000 implies")
    np.save(tmp_path / "y.npy", y)
    assert decide(np.load(tmp_path / "y.npy", mmap_mode="r"), 2)[1].startswith("y[4]=100000")
    assert decide(np.array([0.0, 1.0]), 1) == (1, None)  # not integers: left to the validator


def graph_with(y):
    g = load_dataset("default")
    return Graph(g.indptr, g.indices, x=g.x, y=np.asarray(y), name="karate-labels")


@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_train_refuses_a_stray_label_and_honours_num_classes(mode):
    model = "sage" if mode == "sampled" else "gcn"
    g = load_dataset("default")
    y = np.array(g.y)
    y[5] = 100000
    with pytest.raises(UserError, match=r"y\[5\]=100000 implies 100001 classes, but only 3 distinct labels"):
        train(TrainConfig(epochs=1, backend="cpu", progress=False, mode=mode, model=model), SOLO, graph_with(y))
    with pytest.raises(UserError, match=r"y\[5\]=100000 is not below --num-classes 2"):
        train(TrainConfig(epochs=1, backend="cpu", progress=False, mode=mode, model=model, num_classes=2), SOLO,
              graph_with(y))
    # --num-classes wider than the labels: a wider output layer, the labels unchanged
    res = train(TrainConfig(epochs=2, backend="cpu", progress=False, mode=mode, model=model, num_classes=5), SOLO, g)
    last = [p for p in res.model.parameters() if p.ndim == 2][-1]
    assert 5 in last.shape and int(g.y.max()) + 1 == 2


def test_num_classes_equal_to_the_labels_changes_nothing():
    g = load_dataset("default")
    a = train(TrainConfig(epochs=3, backend="cpu", progress=False), SOLO, g)
    b = train(TrainConfig(epochs=3, backend="cpu", progress=False, num_classes=int(g.y.max()) + 1), SOLO, g)
    assert [e["loss"] for e in a.epochs] == [e["loss"] for e in b.epochs]


@pytest.mark.slow
def test_cli_refuses_a_stray_label_before_the_first_epoch(tmp_path):
    """One line naming y and the row, exit 2; the fault hook of epoch 1 never fires."""
    g = load_dataset("default")
    y = np.array(g.y)
    y[7] = 10**9
    np.savez(tmp_path / "g.npz", indptr=g.indptr, indices=g.indices, x=g.x, y=y)
    r = subprocess.run([sys.executable, "-m", "mgg.train", "--backend", "cpu", "--no-progress", "--epochs", "3",
                        "--dataset", str(tmp_path / "g.npz")], cwd=ROOT, env=env(MGG_FAULT_INJECT="0:1:raise"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"error: dataset '{tmp_path / 'g.npz'}': y[7]=1000000000 implies 1000000001 classes, but "
                        f"only 3 distinct labels occur (the next largest is 1); fix the label, or give "
                        f"--num-classes 1000000001 to train 1000000001 classes\n")
    r = subprocess.run([sys.executable, "-m", "mgg.train", "--backend", "cpu", "--no-progress", "--epochs", "3",
                        "--dataset", str(tmp_path / "g.npz"), "--num-classes", "1000000001"], cwd=ROOT,
                       env=env(MGG_FAULT_INJECT="0:1:raise", MGG_MEMORY_AVAILABLE=str(64 * 2**30)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr  # the memory check, with the classes asked for
    assert r.stderr.startswith(f"error: not enough host memory for {tmp_path / 'g.npz'} (34 nodes, 156 edges, "
                               f"34 features, 1,000,000,001 classes)"), r.stderr
