"""The float32 GEMMs of a GIN step on a tall node matrix, side by side on one GPU (CUDA-event
medians): cuBLAS float32 (what torch runs by default), cuBLAS TF32 (torch's "high" precision,
`--tf32`), and mgg/kernels/tall_gemm.cu (3xTF32 on tensor cores; "-" where it does not take the
widths and mgg runs cuBLAS), each against its memory floor (the bytes it must read and write over
the HBM copy bandwidth measured in the same run) and with its error against float64 on the
first 65,536 rows.

    python bench/dense_gemm.py [--rows 2449029] [--shapes 64x64,100x64,64x47] [--reps 20]

The default row count is products-like's node count; GIN 5x64 on it runs these widths (the first
layer's 100 -> 64 on the cached input aggregation, 64 -> 64 in every MLP, 64 -> 47 last). Also
"x W^T + column stats" (a Linear before a batch norm: cuBLAS then torch.batch_norm_stats, against
the kernel's epilogue sums), and a second table for the batch norm + ReLU applied in the next
GEMM's prologue (mgg.nn.norm_linear): mgg's two steps (the norm + ReLU kernel writing z, then the
GEMM reading it) against the fused kernels, forward and weight gradient.
"""
from __future__ import annotations

import argparse
import statistics

import torch


def median_ms(fn, reps: int) -> float:
    out = []
    for i in range(reps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i >= 3:
            out.append(a.elapsed_time(b))
    return statistics.median(out)


def copy_gbps(reps: int) -> float:
    """HBM copy bandwidth (bytes read + written per second) of a 2 GiB device-to-device copy."""
    src = torch.empty(1 << 29, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps)
    return 2 * src.numel() * 4 / (ms * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_449_029)
    ap.add_argument("--shapes", default="64x64,100x64,64x47", help="KxN pairs: x [rows, K] W^T -> N")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from mgg.kernels import tall_gemm as tg

    n, reps = args.rows, args.reps
    gbps = copy_gbps(reps)
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: n = {n} rows, HBM copy {gbps:.0f} GB/s; ms (median of {reps}), "
          f"% of the memory floor, relative error vs float64 (first 65536 rows)")
    head = 65536
    cases = []
    for shape in args.shapes.split(","):
        k, m = (int(v) for v in shape.split("x"))
        x = torch.randn(n, k, device="cuda")
        w = torch.randn(m, k, device="cuda") / k ** 0.5
        b = torch.randn(m, device="cuda")
        g = torch.randn(n, m, device="cuda")
        nbytes = (n * k + n * m) * 4
        cases.append((f"x W^T + b, ReLU  [{n}, {k}] -> {m}", nbytes,
                      lambda x=x, w=w, b=b: torch._addmm_activation(b, x, w.t()),
                      (lambda x=x, w=w, b=b: tg.xb(x, w.t(), b, True)) if tg.supports(k, m) else None,
                      lambda x=x, w=w, b=b: torch.relu(x[:head].double() @ w.double().t() + b.double())))
        zero = torch.zeros(m, device="cuda")
        cases.append((f"x W^T + col stats [{n}, {k}] -> {m}", nbytes,
                      lambda x=x, w=w: torch.batch_norm_stats(x @ w.t(), 1e-5),
                      (lambda x=x, w=w, z=zero: tg.xb(x, w.t(), None, False, stats_shift=z)) if tg.supports(k, m)
                      else None,
                      lambda x=x, w=w: x[:head].double() @ w.double().t()))
        cases.append((f"G W (grad x)     [{n}, {m}] -> {k}", nbytes,
                      lambda g=g, w=w: g @ w, (lambda g=g, w=w: tg.xb(g, w)) if tg.supports(m, k) else None,
                      lambda g=g, w=w: g[:head].double() @ w.double()))
        cases.append((f"G^T x (grad W)   [{m}, {n}] x [{n}, {k}]", nbytes,
                      lambda g=g, x=x: g.t() @ x,
                      (lambda g=g, x=x: tg.weight_grad(g, x)) if tg.supports_weight_grad(k, m) else None,
                      lambda g=g, x=x: g.double().t() @ x.double()))
    print(f"{'GEMM':46s} | {'cuBLAS fp32':>17s} | {'cuBLAS TF32':>17s} | {'tall_gemm 3xTF32':>17s} | fp32/ours")
    for name, nbytes, cublas, ours, ref in cases:
        floor = nbytes / (gbps * 1e6)
        want = ref()
        cells, ms_of = [], []
        for tf32, fn in ((False, cublas), (True, cublas), (False, ours)):
            if fn is None:
                cells.append(f"{'-':>17s}")
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            ms = median_ms(fn, reps)
            got = fn()
            got = got[0] if isinstance(got, tuple) else got  # (y, stats...): y
            got = got[:head] if got.shape[0] == n else got
            err = float((got.double() - want).norm() / want.norm())
            cells.append(f"{ms:6.3f} {100 * floor / ms:3.0f}% {err:5.0e}")
            ms_of.append(ms)
        torch.backends.cuda.matmul.allow_tf32 = False
        ratio = f"{ms_of[0] / ms_of[2]:5.2f}x" if len(ms_of) == 3 else "  -"
        print(f"{name:46s} | {' | '.join(cells)} | {ratio}")
    prologue_table(n, args.shapes, reps, gbps)


def prologue_table(n: int, shapes: str, reps: int, gbps: float) -> None:
    """Batch norm + ReLU then a Linear (+ ReLU): mgg's two steps against the norm in the GEMM's
    prologue, forward and weight gradient, for the shapes the prologue kernels take."""
    from mgg.kernels import tall_gemm as tg
    from mgg.kernels.norm_relu import bn_relu_forward
    from mgg.kernels.relu_grad import relu_backward_colsum

    print(f"\n{'batch norm + ReLU, then the GEMM':46s} | {'two steps':>10s} | {'prologue':>10s} | speedup | "
          f"prologue % floor")
    for shape in shapes.split(","):
        k, m = (int(v) for v in shape.split("x"))
        if not (tg.supports(k, m, prologue=True) and tg.supports_weight_grad(k, m)):
            continue
        t = torch.randn(n, k, device="cuda") * 2 + 1
        mean, invstd = t.mean(0), torch.rsqrt(t.var(0, unbiased=False) + 1e-5)
        w, b = torch.rand(k, device="cuda") + 0.5, torch.randn(k, device="cuda") * 0.1
        s = w * invstd
        o = b - mean * s
        lw = torch.randn(m, k, device="cuda") / k ** 0.5
        lb = torch.randn(m, device="cuda")
        g = torch.randn(n, m, device="cuda")
        y = torch.relu(torch.randn(n, m, device="cuda"))
        rows = [(f"relu(bn(t)) W^T + b, ReLU [{n}, {k}] -> {m}", (n * k + n * m) * 4,
                 lambda: tg.xb(bn_relu_forward(t, mean, invstd, w, b), lw.t(), lb, True),
                 lambda: tg.xb(t, lw.t(), lb, True, prologue=(s, o))),
                (f"G^T relu(bn(t))  [{m}, {n}] x [{n}, {k}]", (n * k + n * m) * 4,
                 lambda: tg.weight_grad(g, bn_relu_forward(t, mean, invstd, w, b)),
                 lambda: tg.weight_grad(g, t, prologue=(s, o))),
                # the output ReLU's backward too: mask + bias sums (relu_grad.cu), then the GEMM
                ("G' = G (y > 0), sums, G'^T relu(bn(t))", (n * k + 3 * n * m) * 4,
                 lambda: tg.weight_grad(relu_backward_colsum(g, y)[0], t, prologue=(s, o)),
                 lambda: tg.relu_weight_grad(g, y, t, prologue=(s, o))[0])]
        for name, nbytes, two, fused in rows:
            a, f = median_ms(two, reps), median_ms(fused, reps)
            err = float((fused() - two()).double().norm() / two().double().norm())
            print(f"{name:46s} | {a:10.3f} | {f:10.3f} | {a / f:6.2f}x | {100 * nbytes / (gbps * 1e6) / f:3.0f}% "
                  f"(rel diff {err:.0e})")


if __name__ == "__main__":
    main()
