"""The float32 GEMMs of a GIN step on a tall node matrix, side by side on one GPU (CUDA-event
medians): cuBLAS float32 (what torch runs by default), cuBLAS TF32 (torch's "high" precision,
`--tf32`), and mgg/kernels/tall_gemm.cu (3xTF32 on tensor cores; "-" where it does not take the
widths and mgg runs cuBLAS), each against its memory floor (the bytes it must read and write over
the HBM copy bandwidth measured in the same run) and with its error against float64 on the
first 65,536 rows.

    python bench/dense_gemm.py [--rows 2449029] [--shapes 64x64,100x64,64x47] [--reps 20]

The default row count is products-like's node count; GIN 5x64 on it runs these widths (the first
layer's 100 -> 64 on the cached input aggregation, 64 -> 64 in every MLP, 64 -> 47 last).
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
            got = got[:head] if got.shape[0] == n else got
            err = float((got.double() - want).norm() / want.norm())
            cells.append(f"{ms:6.3f} {100 * floor / ms:3.0f}% {err:5.0e}")
            ms_of.append(ms)
        torch.backends.cuda.matmul.allow_tf32 = False
        ratio = f"{ms_of[0] / ms_of[2]:5.2f}x" if len(ms_of) == 3 else "  -"
        print(f"{name:46s} | {' | '.join(cells)} | {ratio}")


if __name__ == "__main__":
    main()
