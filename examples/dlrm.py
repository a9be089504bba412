"""A small DLRM on synthetic Criteo-Kaggle-shaped data, its 26 tables sharded over the ranks.

    mpirun -np 2 python examples/dlrm.py --steps 50

Model (DLRM, Naumov et al. 2019): bottom MLP over 13 dense features -> [B, D]; 26 embedding bags
(the Criteo Kaggle cardinalities, capped by --max-rows on CPU) in one `MultiTableEmbeddingBag`
(one exchange per step for all tables); dot interaction (pairwise dot products of the 27 vectors)
concatenated with the bottom output; top MLP -> click logit; BCE loss.

SPMD: every rank draws its own batch (Zipf-distributed ids, labels from a fixed hidden teacher so
the loss can fall). The MLPs are replicated and their gradients all-reduced; embedding gradients
go to the owning rank (Alltoallv) and row-wise Adagrad updates the owner's rows. The loss is the
mean over the global batch, so P ranks x B samples train like one process with P*B samples.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.embedding import MultiTableEmbeddingBag, RowWiseAdagrad, TableConfig  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import make_store  # noqa: E402

CRITEO_KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
                 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def mlp(sizes: list[int], sigmoid_last: bool = False) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def zipf_ids(rng: np.random.Generator, n: int, size: int, s: float) -> np.ndarray:
    """Bounded Zipf(s) ranks in [0, n), scattered over the id space (hot ids are not all on one shard)."""
    ranks = np.arange(1, n + 1, dtype=np.float64)
    if n <= 1 << 20:
        p = ranks ** -s
        k = rng.choice(n, size=size, p=p / p.sum())
    else:  # inverse CDF of the continuous approximation
        u = rng.random(size)
        k = np.minimum((np.exp(u * np.log(n + 1)) - 1).astype(np.int64), n - 1) if s == 1.0 else \
            np.minimum(((u * ((n + 1) ** (1 - s) - 1) + 1) ** (1 / (1 - s)) - 1).astype(np.int64), n - 1)
    return (k * 2654435761) % n


def teacher(t: int, ids: np.ndarray) -> np.ndarray:
    """A fixed hidden effect in [-1, 1) of every (table, id)."""
    return (((ids * 0x9E3779B1 + t * 0x85EBCA6B) >> 7) % 1000) / 500.0 - 1.0


def make_batch(rng, cards, batch, s, w_dense):
    dense = rng.standard_normal((batch, 13)).astype(np.float32)
    ids = [zipf_ids(rng, n, batch, s) for n in cards]
    score = dense @ w_dense + sum(teacher(t, i) for t, i in enumerate(ids[:8])) * 0.8
    y = (rng.random(batch) < 1 / (1 + np.exp(-score))).astype(np.float32)
    return torch.from_numpy(dense), ids, torch.from_numpy(y)


def interact(x: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
    t = torch.stack([x] + embs, dim=1)  # [B, 27, D]
    z = torch.bmm(t, t.transpose(1, 2))
    i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)
    return torch.cat([x, z[:, i, j]], dim=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=512, help="samples per rank per step")
    p.add_argument("--dim", type=int, default=16, help="embedding dim (= bottom MLP output)")
    p.add_argument("--max-rows", type=int, default=200_000, help="cap on each table's rows (0: full Kaggle sizes)")
    p.add_argument("--bot", default="13-64-16", help="bottom MLP sizes")
    p.add_argument("--top", default="256-64-1", help="top MLP sizes after the interaction")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--lr", type=float, default=0.1, help="MLP SGD learning rate")
    p.add_argument("--emb-lr", type=float, default=0.1, help="row-wise Adagrad learning rate of the tables")
    p.add_argument("--sharding", choices=("range", "hash"), default="range")
    p.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args(argv)

    comm = world()
    torch.manual_seed(args.seed)
    cards = [min(n, args.max_rows) if args.max_rows else n for n in CRITEO_KAGGLE]
    bot = [int(s) for s in args.bot.split("-")]
    if bot[0] != 13 or bot[-1] != args.dim:
        p.error(f"--bot must go from 13 to --dim={args.dim}")
    n_int = 27 * 26 // 2
    top = [args.dim + n_int] + [int(s) for s in args.top.split("-")]
    t0 = time.time()
    emb = MultiTableEmbeddingBag([TableConfig(n, args.dim, "sum", args.sharding, f"C{t + 1}") for t, n in enumerate(cards)],
                                 comm, make_store(comm, args.backend), seed=args.seed, init="uniform")
    dev = torch.device("cuda", torch.cuda.current_device()) if args.backend == "gpu" else torch.device("cpu")
    bot_mlp, top_mlp = mlp(bot).to(dev), mlp(top).to(dev)  # same seed on every rank: replicated weights
    dense_params = list(bot_mlp.parameters()) + list(top_mlp.parameters())
    opt = torch.optim.SGD(dense_params, lr=args.lr)
    emb_opt = RowWiseAdagrad(emb, lr=args.emb_lr)
    if comm.rank == 0:
        print(f"DLRM: {comm.size} ranks, 26 tables ({sum(cards):,} rows x {args.dim}, {args.sharding} sharded, "
              f"{emb.layout.rows_per_pe:,} rows per rank), global batch {args.batch_size * comm.size}, "
              f"setup {time.time() - t0:.1f}s", flush=True)
    w_dense = np.random.default_rng(1234).standard_normal(13) * 0.5
    rng = np.random.default_rng(args.seed * 1000 + comm.rank + 1)
    B, P = args.batch_size, comm.size
    offsets = torch.arange(B)
    losses, times = [], []
    for step in range(1, args.steps + 1):
        ts = time.perf_counter()
        dense, ids, y = make_batch(rng, cards, B, args.zipf, w_dense)
        dense, y = dense.to(dev), y.to(dev)
        x = bot_mlp(dense)
        embs = emb([torch.from_numpy(i) for i in ids], [offsets] * 26)
        logit = top_mlp(interact(x, embs)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="sum") / (B * P)
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([q.grad.reshape(-1) for q in dense_params]).cpu()
        comm.allreduce_(flat.numpy())
        flat = flat.to(dev)
        pos = 0
        for q in dense_params:
            q.grad.copy_(flat[pos: pos + q.numel()].view_as(q))
            pos += q.numel()
        opt.step()
        emb_opt.step()
        gl = comm.allreduce_scalar(float(loss.detach()))
        times.append(time.perf_counter() - ts)
        losses.append(gl)
        if comm.rank == 0 and (step % args.log_every == 0 or step == 1):
            print(f"step {step:4d}  loss {np.mean(losses[-args.log_every:]):.4f}  ({np.median(times) * 1e3:.1f} ms/step)",
                  flush=True)
    if comm.rank == 0:
        k = max(1, len(losses) // 5)
        print(f"loss: first {k} steps {np.mean(losses[:k]):.4f} -> last {k} steps {np.mean(losses[-k:]):.4f}", flush=True)
    emb.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
