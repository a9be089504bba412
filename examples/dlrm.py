"""A small DLRM on synthetic Criteo-Kaggle-shaped data, its 26 tables sharded over the ranks.

    mpirun -np 2 python examples/dlrm.py --steps 50

Model (DLRM, Naumov et al. 2019; `mgg.embedding.dlrm_model`): bottom MLP over 13 dense features
-> [B, D]; 26 embedding bags (the Criteo Kaggle cardinalities, capped by --max-rows on CPU) in one
`MultiTableEmbeddingBag` (one exchange per step for all tables); dot interaction (pairwise dot
products of the 27 vectors) concatenated with the bottom output; top MLP -> click logit; BCE loss.

SPMD: every rank draws its own batch (`mgg.embedding.dlrm_data`: Zipf-distributed ids, labels
from a fixed hidden teacher so the loss can fall). The step is `mgg.embedding.dlrm_train.MggDLRM`
(the one bench/dlrm.py times): the MLPs are replicated and their gradients all-reduced;
embedding gradients go to the owning rank and row-wise Adagrad updates the owner's rows. The
loss is the mean over the global batch, so P ranks x B samples train like one process with P*B
samples.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.embedding.dlrm_data import DLRMBatches  # noqa: E402
from mgg.embedding.dlrm_model import DLRMConfig  # noqa: E402
from mgg.embedding.dlrm_train import MggDLRM  # noqa: E402
from mgg.graph import make_store  # noqa: E402
from mgg.runtime import world  # noqa: E402


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
    try:
        bot = [int(s) for s in args.bot.split("-")]
        top = [int(s) for s in args.top.split("-")]
    except ValueError:
        p.error("--bot and --top are sizes joined by '-', e.g. 13-64-16")
    if bot[0] != 13 or bot[-1] != args.dim:
        p.error(f"--bot must go from 13 to --dim={args.dim}")
    try:
        cfg = DLRMConfig.criteo(args.max_rows, dim=args.dim, bot=tuple(bot[1:-1]), top=tuple(top), zipf=args.zipf,
                                lr=args.lr, emb_lr=args.emb_lr, seed=args.seed)
    except ValueError as e:
        p.error(str(e))
    t0 = time.time()
    model = MggDLRM(cfg, comm, make_store(comm, args.backend), sharding=args.sharding)
    if comm.rank == 0:
        print(f"DLRM: {comm.size} ranks, 26 tables ({sum(cfg.cards):,} rows x {args.dim}, {args.sharding} sharded, "
              f"{model.emb.layout.rows_per_pe:,} rows per rank), global batch {args.batch_size * comm.size}, "
              f"setup {time.time() - t0:.1f}s", flush=True)
    batches = DLRMBatches(cfg, args.batch_size, comm.rank)
    losses, times = [], []
    for step in range(1, args.steps + 1):
        ts = time.perf_counter()
        loss = model.step(batches.next().to(model.device))
        gl = comm.allreduce_scalar(float(loss))
        times.append(time.perf_counter() - ts)
        losses.append(gl)
        if comm.rank == 0 and (step % args.log_every == 0 or step == 1):
            print(f"step {step:4d}  loss {np.mean(losses[-args.log_every:]):.4f}  ({np.median(times) * 1e3:.1f} ms/step)",
                  flush=True)
    if comm.rank == 0:
        k = max(1, len(losses) // 5)
        print(f"loss: first {k} steps {np.mean(losses[:k]):.4f} -> last {k} steps {np.mean(losses[-k:]):.4f}", flush=True)
    model.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
