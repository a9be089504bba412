"""DistBatchNorm (mgg.nn.norm) against torch.nn.BatchNorm1d: forward + backward over n x D rows
(GIN's batch norm on products-like is 2.45M x 64), medians, on the GPU when there is one.

    python bench/batch_norm.py [--rows 2450000] [--dim 64] [--reps 5]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.nn.norm import DistBatchNorm  # noqa: E402


def timed(fn, reps: int, cuda: bool) -> float:
    fn()
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_450_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    x = (torch.randn(args.rows, args.dim, device=dev) * 3 + 1).requires_grad_(True)
    g = torch.randn_like(x)
    res = {}
    for name, mod in (("mgg DistBatchNorm", DistBatchNorm(args.dim)), ("torch BatchNorm1d", torch.nn.BatchNorm1d(args.dim))):
        mod = mod.to(dev).train()

        def step():
            x.grad = None
            mod(x).backward(g)
        res[name] = (timed(step, args.reps, cuda), mod(x).detach())
    xd = x.detach().double()
    ref = (xd - xd.mean(0)) / torch.sqrt(xd.var(0, unbiased=False) + 1e-5)  # weight 1, bias 0
    print(f"{args.rows} x {args.dim} rows on {dev}: forward + backward, median of {args.reps}")
    for name, (ms, out) in res.items():
        print(f"  {name:20} {ms:9.2f} ms   max |output - float64| {float((out.double() - ref).abs().max()):.1e}")


if __name__ == "__main__":
    main()
