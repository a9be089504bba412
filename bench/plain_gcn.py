"""The baselines a user would write without mgg, on one device, from the same ``.npz`` file.

``--impl torch``: plain torch GCN 2 x hidden with each Linear on the narrow side of its
aggregation (it commutes with the sum: the first before, the last after), aggregation = one torch
sparse CSR SpMM by D^-1/2 (A + I) D^-1/2 built on the device; the last layer multiplies only the
training rows of that matrix (the rows the loss reads), as mgg's row sets do. ``--impl pyg``: PyG's ``GCNConv`` (cached normalisation) when PyG is installed.

Prints one JSON line (the last line of stdout) with ``load_s`` (read the file), ``build_s``
(matrix/edge_index on the device), ``first_epoch_end_s`` (from process start), ``median_epoch_ms``,
``peak_gpu_mb`` and ``status`` (``ok``, ``oom`` or ``missing``). Out-of-memory is a result, not
an error. Used by bench/e2e.py; runnable alone:

    python bench/plain_gcn.py --file reddit-like.npz --impl torch --epochs 10
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.baselines import SparseOperator  # noqa: E402
from mgg.apps.phases import process_age_s  # noqa: E402


def _load(path: str):
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        indptr, indices = z["indptr"].astype(np.int64), z["indices"].astype(np.int64)
        x, y = z["x"].astype(np.float32), z["y"].astype(np.int64)
        train = z["train_mask"] if "train_mask" in z.files else np.ones(len(y), dtype=bool)
    return indptr, indices, x, y, train


def _gcn_matrix(indptr, indices, device, rows=None):
    """D^-1/2 (A + I) D^-1/2 as torch sparse CSR float32 [N, N] on `device` (row = target), with
    its transpose kept for the backward (bench.baselines.SparseOperator); with `rows` (int64 [k]
    sorted node ids) only those rows, [k, N]."""
    import torch

    n = len(indptr) - 1
    rows_keep = None if rows is None else rows.to(device)
    ptr = torch.from_numpy(indptr).to(device)
    col = torch.from_numpy(indices).to(device)
    deg = (ptr[1:] - ptr[:-1]).to(torch.float32) + 1.0
    dinv = deg.rsqrt()
    row = torch.repeat_interleave(torch.arange(n, device=device), ptr[1:] - ptr[:-1])
    ar = torch.arange(n, device=device)
    rows, cols = torch.cat([row, ar]), torch.cat([col, ar])
    vals = dinv[rows] * dinv[cols]
    shape = (n, n)
    if rows_keep is not None:  # renumber the kept rows 0..k-1
        new = torch.full((n,), -1, dtype=torch.int64, device=device)
        new[rows_keep] = torch.arange(rows_keep.numel(), device=device)
        keep = new[rows] >= 0
        rows, cols, vals, shape = new[rows[keep]], cols[keep], vals[keep], (rows_keep.numel(), n)
    a = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape).coalesce()
    return SparseOperator(a.to_sparse_csr())


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
            "peak_gpu_mb": peak, "final_loss": float(loss)}


def run_torch(args) -> dict:
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    indptr, indices, x_np, y_np, train_np = _load(args.file)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    y = torch.from_numpy(y_np).to(dev)
    train = torch.nonzero(torch.from_numpy(train_np).to(dev) & (y >= 0)).reshape(-1)
    A = _gcn_matrix(indptr, indices, dev)
    A_train = _gcn_matrix(indptr, indices, dev, rows=train)  # the rows the loss reads
    x = torch.from_numpy(x_np).to(dev)
    classes = int(y_np.max()) + 1
    W1 = torch.nn.Linear(x.shape[1], args.hidden).to(dev)
    W2 = torch.nn.Linear(args.hidden, classes).to(dev)
    opt = torch.optim.Adam(list(W1.parameters()) + list(W2.parameters()), lr=0.01)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    def forward():
        h = A @ W1(F.dropout(x, args.dropout, training=True))  # linear first: aggregate `hidden` wide
        return W2(A_train @ F.dropout(F.relu(h), args.dropout, training=True))  # training rows, hidden wide

    return {"load_s": load_s, "build_s": build_s, **_train(forward, y[train], opt, args.epochs, dev)}


def run_pyg(args) -> dict:
    import torch
    import torch.nn.functional as F
    try:
        from torch_geometric.nn import GCNConv
    except ImportError:
        return {"status": "missing"}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    indptr, indices, x_np, y_np, train_np = _load(args.file)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ptr = torch.from_numpy(indptr).to(dev)
    dst = torch.repeat_interleave(torch.arange(len(indptr) - 1, device=dev), ptr[1:] - ptr[:-1])
    edge_index = torch.stack([torch.from_numpy(indices).to(dev), dst])
    x = torch.from_numpy(x_np).to(dev)
    y = torch.from_numpy(y_np).to(dev)
    train = torch.from_numpy(train_np).to(dev) & (y >= 0)
    classes = int(y_np.max()) + 1
    c1 = GCNConv(x.shape[1], args.hidden, cached=True).to(dev)
    c2 = GCNConv(args.hidden, classes, cached=True).to(dev)
    opt = torch.optim.Adam(list(c1.parameters()) + list(c2.parameters()), lr=0.01)
    build_s = time.perf_counter() - t0
    def forward():
        h = F.relu(c1(F.dropout(x, args.dropout, training=True), edge_index))
        return c2(F.dropout(h, args.dropout, training=True), edge_index)[train]

    return {"load_s": load_s, "build_s": build_s, **_train(forward, y[train], opt, args.epochs, dev)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", required=True, help="graph .npz with indptr, indices, x, y")
    p.add_argument("--impl", choices=("torch", "pyg"), default="torch")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--dropout", type=float, default=0.5)
    args = p.parse_args(argv)
    try:
        res = run_torch(args) if args.impl == "torch" else run_pyg(args)
        res.setdefault("status", "ok")
    except Exception as e:  # noqa: BLE001 - out-of-memory (torch.OutOfMemoryError or a RuntimeError) is a result
        msg = str(e).split("\n")[0][:200]
        res = {"status": "oom" if "out of memory" in msg.lower() else "error", "error": msg}
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
