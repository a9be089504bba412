"""The baselines a user would write without mgg, on one device, from the same ``.npz`` file.

``--impl torch``: the plain torch model (bench/baselines.py ``plain_torch_model``): GCN
(``--model gcn``) with each Linear on the narrow side of its aggregation (it commutes with the
sum: the first before, the last after), aggregation = one torch sparse CSR SpMM by
D^-1/2 (A + I) D^-1/2 built on the device; or GIN (``--model gin``) with the MLP's first Linear
before the sum (A + I), mgg's (= PyG's) architecture (Linear-[BatchNorm1d]-ReLU-Linear MLP and
[BatchNorm1d]-ReLU after each hidden layer, ``--norm``; GIN-0 as mgg's default); or GraphSAGE (``--model sage``, mean: lin_l on the narrow side of the SpMM by
D^-1 A, plus the root term lin_r). The last layer computes only the training rows (the rows the
loss reads), as mgg's row sets do. ``--impl pyg``: the same model in PyG (``GCNConv`` with cached
normalisation, PyG's ``GIN`` model, or ``SAGEConv``; bench/baselines.py ``PygModel``) on
``edge_index`` when PyG is installed; ``--impl pyg-sparse``: the same on the sparse ``adj_t``
(a torch CSR tensor) that PyG's documentation recommends for full-batch training. All drop out
``--dropout`` between layers as mgg's models do (GCN and SAGE also on the input).

Prints one JSON line (the last line of stdout) with ``load_s`` (read the file), ``build_s``
(matrix/edge_index on the device), ``first_epoch_end_s`` (from process start), ``median_epoch_ms``,
``peak_gpu_mb``, ``val_acc`` (after the last epoch) and ``status`` (``ok``, ``oom`` or ``missing``). Out-of-memory is a result, not
an error. Used by bench/e2e.py; runnable alone:

    python bench/plain_model.py --file reddit-like.npz --impl torch --model gin --epochs 10
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.baselines import PygModel, plain_torch_model, pyg_adjacency  # noqa: E402
from mgg.apps.phases import process_age_s  # noqa: E402


def _load(path: str):
    """(graph: indptr, indices, x, y, num_nodes, val (bool [N] or None); train: bool [N]) from
    the .npz."""
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        indptr, indices = z["indptr"].astype(np.int64), z["indices"].astype(np.int64)
        x, y = z["x"].astype(np.float32), z["y"].astype(np.int64)
        train = z["train_mask"] if "train_mask" in z.files else np.ones(len(y), dtype=bool)
        val = z["val_mask"] if "val_mask" in z.files else None
    return SimpleNamespace(indptr=indptr, indices=indices, x=x, y=y, num_nodes=len(indptr) - 1, val=val), train


def _val_acc(model, logits_fn, graph, dev) -> float | None:
    """Validation accuracy (the .npz's val_mask, labels >= 0) of `logits_fn()` (every row's
    logits) in eval mode, after training; None without a val_mask."""
    import torch

    if graph.val is None:
        return None
    model.eval()
    with torch.no_grad():
        pred = logits_fn().argmax(1)
    y = torch.from_numpy(graph.y).to(dev)
    mask = torch.from_numpy(graph.val).to(dev) & (y >= 0)
    return float((pred[mask] == y[mask]).float().mean()) if bool(mask.any()) else None


def _train(forward, target, opt, epochs: int, dev) -> dict:
    """Time `epochs` training steps (forward: the logits of the training rows, cross entropy
    against `target`, backward, step; synchronised): median epoch ms, the first epoch's end from
    process start, peak GPU MiB."""
    import torch
    import torch.nn.functional as F

    times, first_end = [], None
    for _ in range(epochs):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(), target)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if first_end is None:
            first_end = process_age_s()
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else 0.0
    return {"first_epoch_end_s": first_end, "median_epoch_ms": 1e3 * sorted(times)[len(times) // 2],
            "peak_gpu_mb": peak, "final_loss": loss.item()}


def _timed(args, build) -> dict:
    """Load the file, `build(graph, train_np, device)` -> (model, forward: the training rows'
    logits, logits: every row's, target) or None (PyG missing), then train `args.epochs` steps
    with Adam (the model's lr and weight decay) and measure the validation accuracy."""
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    graph, train_np = _load(args.file)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.manual_seed(0)
    built = build(graph, train_np, dev)
    if built is None:
        return {"status": "missing"}
    model, forward, logits, target = built
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    res = {"load_s": load_s, "build_s": build_s, **_train(forward, target, opt, args.epochs, dev)}
    return dict(res, val_acc=_val_acc(model, logits, graph, dev))


def run_torch(args) -> dict:
    import torch

    def build(graph, train_np, dev):
        y = torch.from_numpy(graph.y).to(dev)
        train = torch.nonzero(torch.from_numpy(train_np).to(dev) & (y >= 0)).reshape(-1)
        model, A = plain_torch_model(graph, args.model, args.hidden, args.layers, dev, norm=args.norm,
                                     dropout=args.dropout, train_eps=False)
        A_train = A.rows(train)  # the rows the loss reads
        x = torch.from_numpy(graph.x).to(dev)
        return model, lambda: model(x, A, A_train, train), lambda: model(x, A), y[train]

    return _timed(args, build)


def run_pyg(args, sparse: bool = False) -> dict:
    """PyG on ``edge_index`` (gather-scatter), or with `sparse` on the sparse ``adj_t`` its
    documentation recommends for full-batch training (one SpMM per propagation)."""
    import torch

    def build(graph, train_np, dev):
        try:
            model = PygModel(args.model, graph.x.shape[1], args.hidden, args.layers, int(graph.y.max()) + 1,
                             args.norm, args.dropout, train_eps=False)
        except ImportError:
            return None
        model = model.to(dev)
        if sparse:
            edge_index = pyg_adjacency(graph.indptr, graph.indices, graph.num_nodes, dev)
        else:
            ptr = torch.from_numpy(graph.indptr).to(dev)
            dst = torch.repeat_interleave(torch.arange(graph.num_nodes, device=dev), ptr[1:] - ptr[:-1])
            edge_index = torch.stack([torch.from_numpy(graph.indices).to(dev), dst])
        x = torch.from_numpy(graph.x).to(dev)
        y = torch.from_numpy(graph.y).to(dev)
        train = torch.from_numpy(train_np).to(dev) & (y >= 0)
        return model, lambda: model(x, edge_index)[train], lambda: model(x, edge_index), y[train]

    return _timed(args, build)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", required=True, help="graph .npz with indptr, indices, x, y")
    p.add_argument("--impl", choices=("torch", "pyg", "pyg-sparse"), default="torch",
                   help="plain torch, PyG on edge_index, or PyG on the sparse adj_t")
    p.add_argument("--model", choices=("gcn", "gin", "sage"), default="gcn")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hidden", type=int, default=None, help="hidden width (mgg's model default)")
    p.add_argument("--layers", type=int, default=None, help="layers (mgg's model default)")
    p.add_argument("--dropout", type=float, default=None, help="dropout (mgg's model default)")
    p.add_argument("--lr", type=float, default=None, help="Adam's learning rate (mgg's model default)")
    p.add_argument("--weight-decay", type=float, default=None, help="Adam's weight decay (mgg's model default)")
    p.add_argument("--norm", choices=("batch", "none"), default="batch", help="GIN's MLP norm (mgg's default: batch)")
    args = p.parse_args(argv)
    from mgg.nn.models import MODEL_DEFAULTS

    d = MODEL_DEFAULTS[args.model]  # the same hyperparameters as `python -m mgg.train --model`
    for name in ("hidden", "layers", "dropout", "lr", "weight_decay"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(d, name))
    try:
        res = run_torch(args) if args.impl == "torch" else run_pyg(args, sparse=args.impl == "pyg-sparse")
        res.setdefault("status", "ok")
    except Exception as e:  # noqa: BLE001 - out-of-memory (torch.OutOfMemoryError or a RuntimeError) is a result
        msg = str(e).split("\n")[0][:200]
        res = {"status": "oom" if "out of memory" in msg.lower() else "error", "error": msg}
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
