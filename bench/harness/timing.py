"""GPU timing, copy bandwidths and rank-0 logging of the benchmarks.

`cuda_ms` times whole calls on the host clock (the ranks synchronised around each), as a
training epoch is timed; `gpu_ms` times calls run back to back with CUDA events, as the floors'
kernels and the aggregation rows are timed.
"""
from __future__ import annotations

import statistics
import time


def log(comm, *a):
    if comm.rank == 0:
        print(*a, flush=True)



def cuda_ms(fn, reps: int, comm, sync_all=True) -> list[float]:
    import torch

    out = []
    for _ in range(reps):
        comm.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if sync_all:
            comm.barrier()
        out.append((time.perf_counter() - t) * 1e3)
    return out



def gpu_ms(fn, calls: int = 10, batches: int = 5, warmup: int = 3, comm=None) -> float:
    """GPU milliseconds a call of fn() takes when calls run back to back, as a training step (or
    its CUDA graph) issues them: the median over `batches` of (CUDA-event time of `calls`
    consecutive calls) / calls, after `warmup` calls. No host time between the calls counts: the
    floors' kernels and bench/local_csr.py's rows are timed alike this way (the floors had been
    timed a launch at a time, with the host's launch and synchronisation in each: reddit-like
    D = 64 then read csr_rows at 101-102% of its floor, and 100% timed alike; one H200 each,
    bench/results/2026-11-27-h200x1-7d721e6 c4, c5). With `comm`, the ranks start each batch
    together."""
    import torch

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(batches):
        if comm is not None:
            comm.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / calls)
    return statistics.median(out)


def bandwidths(comm) -> dict:
    """HBM (device copy, read + write bytes) and NVLink (GPU0 -> GPU1 copy) in GB/s."""
    import torch

    n = 1 << 28  # 1 GiB of float32
    a = torch.empty(n, device="cuda").uniform_()
    b = torch.empty_like(a)
    t = gpu_ms(lambda: b.copy_(a), comm=comm)  # back to back, as the floors' kernels are timed
    res = {"hbm_GBps": 2 * 4 * n / t / 1e6}
    del b
    if torch.cuda.device_count() > 1:
        src = torch.cuda.current_device()
        dst = (src + 1) % torch.cuda.device_count()
        c = torch.empty(n, device=f"cuda:{dst}")
        for _ in range(3):
            c.copy_(a)
        def peer():
            c.copy_(a)
            torch.cuda.synchronize(dst)
        t = statistics.median(cuda_ms(peer, 10, comm, sync_all=False))
        res["nvlink_GBps"] = 4 * n / t / 1e6
        del c
    del a
    torch.cuda.empty_cache()
    return res

