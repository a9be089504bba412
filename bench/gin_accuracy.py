"""GIN's accuracy side by side: mgg's GIN (PyG's architecture, the default), mgg's GIN with one
norm per layer (the MLP's only, input dropout: the form before the default changed), and PyG's
`torch_geometric.nn.models.GIN(hidden, layers, dropout, norm="batch_norm")` on the sparse adj_t.

Every run is the same full-batch training on one process: Adam (lr 0.01, weight decay 0, mgg's
GIN defaults), cross entropy on the train mask, 5 layers, hidden 64, dropout 0.5, `--epochs`
epochs, the validation accuracy after the last (eval mode) and the best over the epochs. With
`--cli`, `python -m mgg.train --model gin` with default flags runs on the same graph too (its
metrics JSON's val_acc).

    python bench/gin_accuracy.py --dataset reddit-like --scale 0.05 --epochs 60 [--cli] [--device cuda]

Prints one line per run and, with --json PATH, writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.data import load_dataset  # noqa: E402


def _train(forward, params, y, train, val, epochs: int, seed_model) -> dict:
    opt = torch.optim.Adam(params, lr=0.01, weight_decay=0.0)
    best, times = 0.0, []
    for _ in range(epochs):
        seed_model.train()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward()[train], y[train])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        seed_model.eval()
        with torch.no_grad():
            acc = float((forward()[val].argmax(1) == y[val]).float().mean())
        best = max(best, acc)
    return {"val_acc": acc, "best_val_acc": best, "final_loss": float(loss), "median_epoch_ms": 1e3 * sorted(times)[len(times) // 2]}


def run_mgg(g, args, **gin_options) -> dict:
    from mgg.nn import build_model
    from mgg.graph import DistGraph, RuntimeConfig
    from mgg.runtime.comm import Communicator

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    backend = "gpu" if args.device == "cuda" else "cpu"
    with DistGraph(g.indptr, g.indices, Communicator(), RuntimeConfig(backend=backend)) as dg:
        model = build_model("gin", g.num_features, 64, g.num_classes, 5, 0.5, norm="batch", **gin_options).to(dg.device)
        x = torch.from_numpy(g.x).to(dg.device)
        y, train, val = (torch.from_numpy(a).to(dg.device) for a in (g.y, g.train_mask, g.val_mask))
        return _train(lambda: model(x, dg, gen), list(model.parameters()), y, train, val, args.epochs, model)


def run_pyg(g, args) -> dict:
    from torch_geometric.nn.models import GIN

    from bench.baselines import pyg_adjacency

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    model = GIN(g.num_features, 64, 5, g.num_classes, dropout=0.5, norm="batch_norm").to(dev)
    adj_t = pyg_adjacency(g.indptr, g.indices, g.num_nodes, dev)
    x = torch.from_numpy(g.x).to(dev)
    y, train, val = (torch.from_numpy(a).to(dev) for a in (g.y, g.train_mask, g.val_mask))
    return _train(lambda: model(x, adj_t), list(model.parameters()), y, train, val, args.epochs, model)


def run_cli(args) -> dict:
    from mgg.data import save_npz
    from mgg.train import main

    with tempfile.TemporaryDirectory() as d:
        path, metrics = os.path.join(d, "g.npz"), os.path.join(d, "m.json")
        save_npz(load_dataset(args.dataset, scale=args.scale, seed=args.seed), path)
        backend = "gpu" if args.device == "cuda" else "cpu"
        main(["--dataset", path, "--model", "gin", "--epochs", str(args.epochs), "--backend", backend,
              "--no-progress", "-q", "--metrics-json", metrics, "--seed", str(args.seed)])
        with open(metrics) as f:
            m = json.load(f)
    return {"val_acc": m["val_acc"], "final_loss": m["final_loss"], "median_epoch_ms": m["median_epoch_ms"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="reddit-like")
    p.add_argument("--scale", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--cli", action="store_true", help="also python -m mgg.train --model gin (default flags)")
    p.add_argument("--no-pyg", action="store_true")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    g = load_dataset(args.dataset, scale=args.scale, seed=args.seed)
    print(f"{g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {g.num_features} features, "
          f"{g.num_classes} classes; {args.epochs} epochs on {args.device}", flush=True)
    runs = {"mgg-gin (default: PyG's architecture)": lambda: run_mgg(g, args),
            "mgg-gin one norm per layer (before)": lambda: run_mgg(g, args, post_norm=False, input_dropout=True)}
    if not args.no_pyg:
        runs["pyg GIN(norm=batch_norm), adj_t"] = lambda: run_pyg(g, args)
    if args.cli:
        runs["mgg.train --model gin (CLI)"] = lambda: run_cli(args)
    out = {}
    for name, fn in runs.items():
        try:
            r = fn()
        except ImportError as e:
            r = {"error": f"not installed: {e.name}"}
        out[name] = r
        line = "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
        print(f"{name:42} {line}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dataset": g.name, "epochs": args.epochs, "device": args.device, "runs": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
