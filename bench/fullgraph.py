"""Full-graph training benchmark: mgg's kernels against the baselines, side by side in one run.

    mpirun -np P python bench/fullgraph.py [--datasets reddit-like:1,products-like:1,papers-like:0.02]
                                           [--models gcn,gin] [--epochs 5] [--warmup 2]

A dataset is name[:scale[:order]]; an order (degree, rcm, cluster: mgg.data.reorder) relabels the
generated graph once before it is cached and partitioned, and its rows are named name+order
(e.g. products-like:1:cluster -> products-like+cluster).

Per dataset and model (GCN 2x16, GIN 5x64, as in MGG §7; `gin` is mgg's default GIN with batch
norm in its MLP, and every baseline then has the same BatchNorm1d; `gin:none` is GIN without a
norm) it times one training epoch (forward,
backward, gradient all-reduce, Adam step; dropout off for every system) of
  * mgg with each kernel variant (pipelined, pipelined_2pass, ptr, halo, nonpipelined = baseline b),
  * baseline (a): NCCL all-to-all of the halo rows, then torch sparse CSR SpMM (bench/baselines.py),
  * with P = 1 only: the plain torch model a user would write (torch sparse CSR SpMM, the first
    Linear before the aggregation: `torch-plain-1gpu`), baseline (c) mgg's model over torch
    sparse CSR on one GPU, and (d) PyG GCNConv/GINConv,
and, for each variant, the aggregation kernel alone at the model's width against two floors:
compulsory HBM bytes (an index per edge, row pointers, each distinct source row once, self rows,
output) / HBM bandwidth + remote bytes / NVLink bandwidth, and gathered bytes / the rate a bare
gather-sum kernel gets on the plan's own source-index stream at the same width (its L1/L2 reuse
included), measured in the same run.
Bandwidths: a device-to-device copy, a copy from GPU 0 to GPU 1. Medians over epochs.
Results go to bench/results/fullgraph-<gpu>-P<P>-<date>.json; `--summarize FILES` prints the
combined table (speedups against P = 1 and the baselines).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import inspect
import itertools
import json
import os
import socket
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.kernels.variants import benched_variant_names  # noqa: E402
from mgg.runtime.layout import padded_dim  # noqa: E402

VARIANTS = benched_variant_names()  # the registry (mgg/kernels/variants.py) says which are timed


def variants_for(dg, wanted: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The benched variants (or those of `wanted`, from --variants) that can run this partition:
    local-only kernels (csr_rows) need every rank free of remote work (the same answer on all ranks)."""
    from mgg.kernels.variants import get_variant

    remote = dg.comm.allreduce_scalar(float(sum(dg.plan(k).num_remote_edges for k in ("gcn", "sum"))), "max")
    return tuple(v for v in (wanted or VARIANTS) if not (get_variant(v).local_only and remote > 0))


def model_spec(spec: str) -> dict:
    """hidden, layers and aggregation kind of model `spec`, from the model registry
    (mgg.nn.registry), with its registry `name` and constructor `options`: "gin" is mgg's default
    GIN (batch norm in the MLP), "gin:none" / "gin:layer" pick GIN's `norm`; a "+unfused" suffix
    (mgg's model only, e.g. "gin+unfused") runs batch norm and the ReLU after it as two steps
    instead of mgg.kernels.norm_relu's fused kernels (`unfused` in the result), and a "+cublas"
    suffix runs mgg's model with its float32 GEMMs on cuBLAS (MGG_TALL_GEMM=0, not
    mgg/kernels/tall_gemm.cu; `cublas`); `mgg_only` is either suffix (the baselines are timed on
    the plain row only). SystemExit for a model whose aggregation does not run through the plan
    (nothing to compare) or a bad norm."""
    from mgg.nn.norm import NORMS
    from mgg.nn.registry import model_entry, tunable_models

    unfused = spec.endswith("+unfused")
    cublas = spec.endswith("+cublas")
    name, _, norm = spec.removesuffix("+unfused").removesuffix("+cublas").partition(":")
    if norm and (name != "gin" or norm not in NORMS):
        raise SystemExit(f"bench/fullgraph.py: --models {spec}: only gin takes a norm ({', '.join(NORMS)})")
    try:
        e = model_entry(name)
    except ValueError as err:
        raise SystemExit(f"bench/fullgraph.py: --models: {err}") from None
    if e.aggregation is None:
        raise SystemExit(f"bench/fullgraph.py: --models {name}: its aggregation does not run through the plan; "
                         f"choose from {', '.join(tunable_models())}")
    options = {}
    if name == "gin":  # the norm every system of the row runs: the model's own default unless given
        options["norm"] = norm or inspect.signature(e.model).parameters["norm"].default
    return dict(name=name, options=options, hidden=e.defaults.hidden, layers=e.defaults.layers,
                kind=e.aggregation, unfused=unfused, cublas=cublas, mgg_only=unfused or cublas)


def build_bench_model(mname: str, g, device, input_cache: bool = True):
    """mgg's model for --models entry `mname` on graph g (dropout off, as every system here).
    `input_cache`: the first layer starts from its input's aggregation computed once
    (mgg.nn.input_cache; the model's default), else it aggregates every step."""
    from mgg.nn import build_model

    m = model_spec(mname)
    model = build_model(m["name"], g.x.shape[1], m["hidden"], int(g.y.max()) + 1, m["layers"], 0.0,
                        **m["options"]).to(device)
    model.cache_input_aggregation = bool(input_cache)
    for mod in model.modules():
        if hasattr(mod, "fuse_relu"):
            mod.fuse_relu = not m["unfused"]
    return model


def _variant_list(text: str) -> tuple[str, ...]:
    """--variants: registered names only (argparse error otherwise)."""
    import argparse

    from mgg.kernels.variants import variant_names

    names = tuple(v for v in text.split(",") if v)
    bad = [v for v in names if v not in variant_names()]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {bad}; choose from {', '.join(variant_names())}")
    return names


def log(comm, *a):
    if comm.rank == 0:
        print(*a, flush=True)


def parse_dataset(spec: str) -> tuple[str, float, str]:
    """"name[:scale[:order]]" -> (name, scale, node order): e.g. "products-like:1:cluster" is
    products-like at scale 1 relabelled by mgg.data.reorder's "cluster" before partitioning."""
    name, _, rest = spec.partition(":")
    sc, _, order = rest.partition(":")
    return name, float(sc or 1), order or "none"


def load_graph(name: str, scale: float, cache: str, comm, order: str = "none"):
    """Generate once (rank 0; relabelled by `order` unless "none", on the GPU when there is one),
    cache as .npz, load on every rank. The graph's name carries a non-default order
    ("products-like+cluster"), so result rows tell the orders apart."""
    from mgg.data import load_dataset, load_npz, save_npz

    tag = "" if order == "none" else f"-{order}"
    label = name if order == "none" else f"{name}+{order}"
    path = os.path.join(cache, f"{name}-{scale:g}{tag}.npz")
    if comm.rank == 0 and not os.path.exists(path):
        t = time.perf_counter()
        g = load_dataset(name, scale=scale, seed=0)
        print(f"  generated {name} scale {scale:g}: {g.num_nodes} nodes {g.num_edges} edges "
              f"in {time.perf_counter() - t:.1f} s", flush=True)
        if order != "none":
            import torch

            from mgg.data.reorder import reorder_nodes

            t = time.perf_counter()
            g, _ = reorder_nodes(g, order, device="cuda" if torch.cuda.is_available() else "cpu")
            print(f"  relabelled ({order}) in {time.perf_counter() - t:.1f} s", flush=True)
        os.makedirs(cache, exist_ok=True)
        save_npz(g, path)
    comm.barrier()
    return load_npz(path, name=label)


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


def epoch_fn(model, G, x, y, train_mask, n_train, opt, comm):
    from mgg.nn import allreduce_gradients, cross_entropy_sum

    sets = getattr(G, "bench_train_rows", None)  # mgg's per-layer row sets of the loss (as the CLI)
    layers = len(model.convs)
    rows = None if sets is None else tuple(sets[len(sets) - layers:])  # the model's last `layers`
    train_idx = train_mask.nonzero().squeeze(1)  # an index, not a mask: no host sync in the step
    y_train = y.index_select(0, train_idx)

    def step():
        opt.zero_grad(set_to_none=False)
        if rows is not None:
            loss = cross_entropy_sum(model(x, G, None, rows=rows), y[rows[-1].index]) / n_train
        else:
            out = model(x, G, None)
            loss = cross_entropy_sum(out.index_select(0, train_idx), y_train) / n_train
        loss.backward()
        if comm.size > 1:
            allreduce_gradients(model, comm, getattr(G, "store", None))
        opt.step()
    return step


def epoch_traffic(dg, mname: str, g, comm, device, input_cache: bool = True) -> dict:
    """What one training epoch of `mname` moves between GPUs, counted on the aggregations it
    really runs: each call (kind, direction, width) of dg.aggregate is recorded during one step
    (after a first, uncounted step that builds the model's input cache, a one-time cost), and
    each of them must bring every distinct remote row of its plan once (the halo; per-edge
    variants move more). Returns {"calls": [[kind, transposed, width], ...], "nvlink_bytes"}
    (this rank's; the caller takes the max over ranks)."""
    import torch

    calls = []
    real = dg.aggregate

    def counting(x, kind, transposed=False, **kw):
        calls.append([kind, bool(transposed), int(x.shape[1])])
        return real(x, kind, transposed, **kw)
    x = torch.from_numpy(np.ascontiguousarray(dg.local(g.x))).to(device)
    y = torch.from_numpy(np.ascontiguousarray(dg.local(g.y))).to(device)
    tm = torch.from_numpy(np.ascontiguousarray(dg.local(g.train_mask))).to(device)
    torch.manual_seed(0)
    model = build_bench_model(mname, g, device, input_cache)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = epoch_fn(model, dg, x, y, tm, float(g.train_mask.sum()), opt, comm)
    if input_cache:
        step()
    dg.aggregate = counting
    try:
        step()
    finally:
        del dg.aggregate  # the bound method again
    nbytes = sum(dg.plan(k, t).halo_size * padded_dim(w) * 4 for k, t, w in calls)
    return {"calls": calls, "nvlink_bytes": nbytes}


def _cuda_gen():
    """A private CUDA generator for the bench's random tables: a failed CUDA-graph capture leaves
    torch's default CUDA generator marked as capturing, and every later draw from it raises."""
    import torch

    return torch.Generator(device="cuda").manual_seed(0)


def graph_ms(step, args, comm):
    """Median ms of `step` captured once in a CUDA graph and replayed: (ms, None), or (None, why)
    when the step cannot be captured. At P > 1 the graph holds the NVSHMEM barriers and the
    on-stream gradient reduction too (every rank captures the same step). Adam is capturable
    (its step counts on the GPU) and the bench trains without dropout, so each replay is a
    training step."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception as e:  # noqa: BLE001 - the reason is the result
        graph.reset()
        torch.cuda.synchronize()
        return None, f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    cuda_ms(graph.replay, args.warmup, comm)
    return statistics.median(cuda_ms(graph.replay, args.epochs, comm)), None


def time_system(build_G, mname, g, comm, args, device, graph_row: dict | None = None,
                input_cache: bool | None = None):
    """Median epoch ms of model `mname` over graph wrapper G (None when out of memory). With
    `graph_row` (a dict), also the step captured in a CUDA graph: graph_row["ms"|"error"].
    `input_cache`: the model's first-layer input cache (None: on unless --input-cache off)."""
    import torch

    from mgg.nn.optim import Adam

    try:
        G = build_G()
        x = torch.from_numpy(np.ascontiguousarray(G.local(g.x))).to(device)
        y = torch.from_numpy(np.ascontiguousarray(G.local(g.y))).to(device)
        tm = torch.from_numpy(np.ascontiguousarray(G.local(g.train_mask))).to(device)
        n_train = float(g.train_mask.sum())
        torch.manual_seed(0)
        model = build_bench_model(mname, g, device,
                                  args.input_cache != "off" if input_cache is None else input_cache)
        # the CLI's optimizer; with a CUDA graph its step counts live on the GPU, so each replay
        # is a training step (the bench trains without dropout: no host seed in the step)
        opt = Adam(model.parameters(), lr=0.01, capturable=graph_row is not None)
        step = epoch_fn(model, G, x, y, tm, n_train, opt, comm)
        cuda_ms(step, args.warmup, comm)
        ms = statistics.median(cuda_ms(step, args.epochs, comm))
        err = None
        if graph_row is not None:
            graph_row["ms"], graph_row["error"] = graph_ms(step, args, comm)
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return ms, err


def plain_torch_epoch(g, mname, args, device, comm):
    """Median epoch ms of the plain torch model a user would write (bench/baselines.py
    PlainTorchGCN/GIN: torch sparse CSR SpMM, the Linears on the narrow side, the last layer on
    the training rows only)."""
    import torch
    import torch.nn.functional as F

    from bench.baselines import plain_torch_model

    m = model_spec(mname)
    try:
        torch.manual_seed(0)
        model, A = plain_torch_model(g, m["name"], m["hidden"], m["layers"], device,
                                     norm=m["options"].get("norm", "none"))
        x = torch.from_numpy(g.x).to(device)
        y = torch.from_numpy(g.y).to(device)
        train = torch.nonzero(torch.from_numpy(g.train_mask).to(device)).reshape(-1)
        A_out = A.rows(train)  # the last layer on the rows the loss reads
        kw = {"out_index": train} if m["name"] == "gin" else {}
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x, A, A_out, **kw), y[train]).backward()
            opt.step()
        cuda_ms(step, args.warmup, comm, sync_all=False)
        ms, err = statistics.median(cuda_ms(step, args.epochs, comm, sync_all=False)), None
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    except ValueError as e:  # a model the plain-torch baseline does not have (e.g. gin:layer)
        ms, err = None, str(e)
    torch.cuda.empty_cache()
    return ms, err


def pyg_epoch(g, mname, args, device, comm):
    """Median epoch ms of the same model in PyG (bench/baselines.py PygModel), loss on the
    training rows."""
    import torch
    import torch.nn.functional as F

    from bench.baselines import PygModel

    m = model_spec(mname)
    if m["name"] not in ("gcn", "gin"):
        return None, f"no PyG baseline for {mname}"
    try:
        ei = torch.from_numpy(g.edge_index()).to(device)
        x = torch.from_numpy(g.x).to(device)
        y = torch.from_numpy(g.y).to(device)
        tm = torch.from_numpy(g.train_mask).to(device)
        try:  # mgg's GIN MLP: Linear-[BatchNorm1d]-ReLU-Linear
            model = PygModel(m["name"], g.x.shape[1], m["hidden"], m["layers"], int(g.y.max()) + 1,
                             m["options"].get("norm", "none")).to(device)
        except ImportError:
            return None, "torch_geometric not installed"
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x, ei)[tm], y[tm]).backward()
            opt.step()
        cuda_ms(step, args.warmup, comm, sync_all=False)
        ms, err = statistics.median(cuda_ms(step, args.epochs, comm, sync_all=False)), None
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return ms, err


_GATHER_SRC = r"""
template <int U, bool WINDOW>
__global__ void gather_sum(const float4* __restrict__ table, const int* __restrict__ idx,
                           long long n_idx, int d4, float4* __restrict__ out) {
    // lanes in groups of d4 (d4 <= 32, a power of two), 16 B per lane, U rows in flight per group
    // (independent loads and sums: the memory system, not one load's latency, sets the rate).
    // WINDOW = false: warp w reads slice w of n_idx / warps entries (every warp in a different
    // part of the stream at once); WINDOW = true: warp w reads chunks w, w + warps, ... of
    // U * groups entries (the warps at work read one window of the stream, as a kernel that
    // hands consecutive work to consecutive warps does).
    const int lane = threadIdx.x & 31, groups = 32 / d4, g = lane / d4, c = lane % d4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    float4 acc[U];
    #pragma unroll
    for (int u = 0; u < U; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (WINDOW) {
        const long long step = (long long)U * groups;
        for (long long base = warp * step; base < n_idx; base += nwarps * step) {
            int r[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long k = base + u * groups + g;
                r[u] = k < n_idx ? __ldcs(idx + k) : -1;
            }
            #pragma unroll
            for (int u = 0; u < U; ++u) if (r[u] >= 0) {
                const float4 v = __ldg(table + (long long)r[u] * d4 + c);
                acc[u].x += v.x; acc[u].y += v.y; acc[u].z += v.z; acc[u].w += v.w;
            }
        }
    } else {
        const long long per = (n_idx + nwarps - 1) / nwarps, lo = warp * per;
        const long long hi = lo + per < n_idx ? lo + per : n_idx;
        long long k = lo + g;
        for (; k + (U - 1) * groups < hi; k += U * groups) {
            int r[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) r[u] = __ldcs(idx + k + u * groups);
            #pragma unroll
            for (int u = 0; u < U; ++u) {
                const float4 v = __ldg(table + (long long)r[u] * d4 + c);
                acc[u].x += v.x; acc[u].y += v.y; acc[u].z += v.z; acc[u].w += v.w;
            }
        }
        for (; k < hi; k += groups) {
            const float4 v = __ldg(table + (long long)idx[k] * d4 + c);
            acc[0].x += v.x; acc[0].y += v.y; acc[0].z += v.z; acc[0].w += v.w;
        }
    }
    #pragma unroll
    for (int u = 1; u < U; ++u) { acc[0].x += acc[u].x; acc[0].y += acc[u].y; acc[0].z += acc[u].z; acc[0].w += acc[u].w; }
    out[blockIdx.x * (long long)blockDim.x + threadIdx.x] = acc[0];
}
"""
_GATHER_SHFL_SRC = r"""
template <int D4, int U, bool WINDOW>
__global__ void gather_sum_shfl(const float4* __restrict__ table, const int* __restrict__ idx,
                                long long n_idx, float4* __restrict__ out) {
    // The bare gather with the indices loaded as a row kernel loads them: one coalesced index per
    // lane (M of them a step) and each broadcast to its lane group by a shuffle, so an index costs
    // 4 bytes of one warp-wide load instead of a load instruction per lane group. D4 lanes a row
    // (G = 32 / D4 groups), U rows in flight a group: PER = U * G entries a sub-step, a step of
    // 32 * M entries runs SUB sub-steps (a warp-wide index load serves 32 / PER of them when
    // PER < 32, so few rows in flight need not mean wasted index loads or registers).
    // WINDOW = true: warp w takes steps w, w + warps, ... (one moving window of the stream);
    // false: warp w walks slice w of n_idx / warps entries (every warp in its own part).
    constexpr int G = 32 / D4, PER = U * G;
    constexpr int M = PER >= 32 ? PER / 32 : 1, SUB = PER >= 32 ? 1 : 32 / PER, STEP = 32 * M;
    static_assert(PER % 32 == 0 || 32 % PER == 0, "U * G must divide or be a multiple of 32");
    const int lane = threadIdx.x & 31, g = lane / D4, c = lane % D4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    long long first, stride, hi;
    if (WINDOW) {
        first = warp * STEP; stride = nwarps * STEP; hi = n_idx;
    } else {
        const long long per = (n_idx + nwarps - 1) / nwarps;
        first = warp * per; stride = STEP; hi = first + per < n_idx ? first + per : n_idx;
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);  // one sum: the U loads are issued before it reads them
    for (long long base = first; base < hi; base += stride) {
        int my[M];
        #pragma unroll
        for (int m = 0; m < M; ++m) {
            const long long k = base + m * 32 + lane;
            my[m] = k < hi ? __ldcs(idx + k) : -1;
        }
        #pragma unroll
        for (int s = 0; s < SUB; ++s) {
            float4 r[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) {  // entry e = s * PER + u * G + g of the step: register e / 32, lane e % 32
                const int e0 = s * PER + u * G;
                const int j = __shfl_sync(0xffffffffu, my[e0 / 32], e0 % 32 + g);
                r[u] = j >= 0 ? __ldg(table + (long long)j * D4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < U; ++u) { acc.x += r[u].x; acc.y += r[u].y; acc.z += r[u].z; acc.w += r[u].w; }
        }
    }
    out[blockIdx.x * (long long)blockDim.x + threadIdx.x] = acc;
}
"""
_GATHER_ROWS_SRC = r"""
template <int D4, bool GROUP, bool PREFETCH>
__global__ void gather_rows(const float4* __restrict__ table, const int* __restrict__ idx,
                            const long long* __restrict__ indptr, long long n_rows, float4* __restrict__ out) {
    // The bare gather over the CSR's rows, as a row kernel walks them: one row per warp (GROUP =
    // false; its G = 32 / D4 lane groups take entries g, g + G, ... of each 32-entry step, every
    // index loaded once by a lane and broadcast by a shuffle, 32 / G rows in flight a group) or
    // one row per lane group (GROUP = true: G rows a warp, D4 entries a step a group, indices
    // shuffled inside the group). Warps take rows in CSR order, one warp (or G rows) each, no
    // loop over tasks: the warps in flight work on neighbouring rows, each walking its list in
    // order -- the locality a row kernel gets from neighbour lists that ascend. PREFETCH: the
    // next step's indices are loaded before this step's rows (as csr_rows does). No weights, no
    // row writes: one conditional store a thread (never taken) keeps the loads alive.
    constexpr int G = 32 / D4;
    const int lane = threadIdx.x & 31, g = lane / D4, c = lane % D4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!GROUP) {
        if (warp >= n_rows) return;
        const long long s = indptr[warp], e = indptr[warp + 1];
        int next = PREFETCH && s + lane < e ? __ldcs(idx + s + lane) : -1;
        for (long long base = s; base < e; base += 32) {
            const long long k = base + lane;
            const int my = PREFETCH ? next : (k < e ? __ldcs(idx + k) : -1);
            if (PREFETCH) next = k + 32 < e ? __ldcs(idx + k + 32) : -1;
            float4 r[32 / G];
            #pragma unroll
            for (int u = 0; u < 32 / G; ++u) {
                const int j = __shfl_sync(0xffffffffu, my, u * G + g);
                r[u] = j >= 0 ? __ldg(table + (long long)j * D4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < 32 / G; ++u) { acc.x += r[u].x; acc.y += r[u].y; acc.z += r[u].z; acc.w += r[u].w; }
        }
    } else {
        const long long row = warp * G + g;
        if (warp * G >= n_rows) return;
        const long long s = row < n_rows ? indptr[row] : 0, e = row < n_rows ? indptr[row + 1] : 0;
        const int mine = (int)((e - s + D4 - 1) / D4);
        const int steps = (int)__reduce_max_sync(0xffffffffu, (unsigned)mine);
        int next = PREFETCH && s + c < e ? __ldcs(idx + s + c) : -1;
        for (int t = 0; t < steps; ++t) {
            const long long k = s + (long long)t * D4 + c;
            const int my = PREFETCH ? next : (k < e ? __ldcs(idx + k) : -1);
            if (PREFETCH) next = k + D4 < e ? __ldcs(idx + k + D4) : -1;
            float4 r[D4];
            #pragma unroll
            for (int u = 0; u < D4; ++u) {
                const int j = __shfl_sync(0xffffffffu, my, g * D4 + u);
                r[u] = j >= 0 ? __ldg(table + (long long)j * D4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < D4; ++u) { acc.x += r[u].x; acc.y += r[u].y; acc.z += r[u].z; acc.w += r[u].w; }
        }
    }
    if (acc.x == -1.2345e30f) out[threadIdx.x] = acc;
}
"""


def _shfl_rows_in_flight(d4: int) -> list[int]:
    """The U (rows in flight a lane group) gather_sum_shfl is built for at d4 lanes a row: 2, 4, 8
    and 16 wherever U * (32 / d4) divides or is a multiple of 32 (every power-of-two d4)."""
    groups = 32 // d4
    return [u for u in (2, 4, 8, 16) if (u * groups) % 32 == 0 or 32 % (u * groups) == 0]


#: (rows in flight per lane group, blocks per SM, threads per block) tried by gather_bandwidth;
#: the best is the floor (256-thread blocks alone were beaten by csr_rows' 128-thread blocks on
#: reddit-like, D = 64)
_GATHER_SHAPES = ((4, 16, 128), (8, 8, 256), (16, 8, 256), (8, 16, 128), (16, 16, 128), (8, 32, 64), (16, 32, 64))


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


#: how far a kernel may read past a floor before the bench calls the floor wrong: the spread of
#: repeated timings of one kernel (bench/local_csr.py's rows: within 1% from batch to batch)
FLOOR_SPREAD = 0.01


def floor_note(floor_ms: float, ms: float) -> str:
    """What a bench row says beside its gather-floor ratio: nothing below the floor; "at the
    gather floor" within FLOOR_SPREAD of it; beyond that the floor is wrong, and it says so."""
    if floor_ms <= ms:
        return ""
    if floor_ms <= ms * (1.0 + FLOOR_SPREAD):
        return f"  [at the gather floor: {floor_ms / ms * 100:.1f}%, within the timing's {FLOOR_SPREAD:.0%} spread]"
    return f"  [above the gather floor ({floor_ms / ms * 100:.1f}%): the micro-kernel underrates this graph's gather]"


def _launch_ms(fn, grid: int, block: int, args: tuple, comm) -> float:
    """GPU ms of a launch of CuPy function `fn` (grid, block, args), back to back (gpu_ms)."""
    return gpu_ms(lambda: fn((grid,), (block,), args), comm=comm)


def gather_bandwidth(dim: int, comm, indices=None, table_rows: int | None = None, table_mb: float = 8.0,
                     gathered_gb: float = 1.0, orders=(), rates: list | None = None, indptr=None) -> float:
    """GB/s of gathered rows of width `dim` delivered by the memory system to a bare gather-sum
    kernel (16 B loads, lane groups per row, 4, 8 or 16 rows in flight per group, 2048 threads
    per SM in blocks of 64, 128 or 256, each warp on a balanced slice of the stream or on chunks
    of one moving window: 14 shapes; and gather_sum_shfl, the window-scheduled gather with one
    coalesced index load a lane broadcast by shuffles, as the row kernels load them, at 2, 4, 8
    or 16 rows in flight, on slices or on a window, and the same three block sizes; the best of
    all; no weights, no row bookkeeping, one write per thread).

    With `indices` (the plan's own source-index stream, int [E], into a [table_rows, dim] table)
    this is the rate the hardware gives THIS graph's access pattern -- its L1/L2 reuse included --
    so gathered bytes / it is the gather floor of any aggregation that reads the rows in this
    order. `orders`: further orders of the same stream (int64 position tensors, e.g.
    CsrRowsExecutor.visit_order: the order a row kernel takes the entries in), timed too; the
    best of all orders is returned, so the floor also holds for a kernel whose order has the
    better locality. `rates`: a list that gets each stream's best GB/s (the plan's order first,
    then `orders`; or random, sequential). Without `indices`, it is the best of uniformly random
    and sequential rows of an L2-resident `table_mb` table (a random-row rate is no floor for a
    graph whose hubs repeat in L1).

    `indptr` (int64 [rows + 1], the CSR whose entries `indices` lists, in that order): the plan's
    stream is also timed with gather_rows, the bare gather that walks the CSR's rows (one warp or
    one lane group a row, rows in CSR order, blocks of 64, 128 or 256 threads, with and without
    the next step's indices loaded ahead): with ascending neighbour lists a row kernel's warps in
    flight read neighbouring source rows, a locality the flat-stream shapes do not have (csr_rows
    beat them on reddit-like D = 64 once rows were sorted)."""
    import cupy as cp
    import torch

    dp = padded_dim(dim)
    d4 = dp // 4
    while 32 % d4:            # lane groups need a power of two; wider rows use more loads per lane
        d4 -= 1
    if indices is not None:
        rows = max(1, int(table_rows))
        streams = [torch.from_numpy(np.asarray(indices)).to("cuda", torch.int32)]
        streams += [streams[0][o.to("cuda")] for o in orders]
        n_idx = len(indices)
    else:
        rows = max(1, int(table_mb * 2**20) // (16 * d4))
        n_idx = int(gathered_gb * 1e9) // (16 * d4)
        streams = [torch.randint(0, rows, (n_idx,), device="cuda", dtype=torch.int32, generator=_cuda_gen()),
                   (torch.arange(n_idx, device="cuda", dtype=torch.int64) % rows).to(torch.int32)]
    if n_idx == 0:
        return float("inf")
    table = torch.randn(rows, 4 * d4, device="cuda", generator=_cuda_gen())
    sms = torch.cuda.get_device_properties(table.device).multi_processor_count
    out = torch.empty(sms * max(b * t for _, b, t in _GATHER_SHAPES), 4, device="cuda")
    names = [f"gather_sum<{u}, {w}>" for u in sorted({u for u, _, _ in _GATHER_SHAPES}) for w in ("false", "true")]
    mod = cp.RawModule(code=_GATHER_SRC, options=("-std=c++17",), name_expressions=names)
    shfl_names = [f"gather_sum_shfl<{d4}, {u}, {w}>" for u in _shfl_rows_in_flight(d4) for w in ("false", "true")]
    shfl = cp.RawModule(code=_GATHER_SHFL_SRC, options=("-std=c++17",), name_expressions=shfl_names)
    best = 0.0
    for ids in streams:
        args = (np.uint64(table.data_ptr()), np.uint64(ids.data_ptr()), np.int64(n_idx), np.int32(d4),
                np.uint64(out.data_ptr()))
        candidates = [(mod.get_function(f"gather_sum<{u}, {w}>"), sms * per_sm, block, args)
                      for (u, per_sm, block), w in itertools.product(_GATHER_SHAPES, ("false", "true"))]
        candidates += [(shfl.get_function(name), sms * per_sm, block, args[:3] + args[4:])  # d4: a template argument
                       for name, (per_sm, block) in itertools.product(shfl_names, ((8, 256), (16, 128), (32, 64)))]
        if indptr is not None and ids is streams[0]:  # the rows kernels: the stream in CSR order only
            ip = torch.from_numpy(np.asarray(indptr, dtype=np.int64)).to("cuda")
            n_rows = ip.numel() - 1
            rmod = cp.RawModule(code=_GATHER_ROWS_SRC, options=("-std=c++17",),
                                name_expressions=[f"gather_rows<{d4}, {w}, {pf}>" for w in ("false", "true")
                                                  for pf in ("false", "true")])
            rargs = (np.uint64(table.data_ptr()), np.uint64(ids.data_ptr()), np.uint64(ip.data_ptr()),
                     np.int64(n_rows), np.uint64(out.data_ptr()))
            for (w, per_warp), pf, block in itertools.product((("false", 1), ("true", 32 // d4)), ("false", "true"),
                                                              (64, 128, 256)):
                warps = -(-n_rows // per_warp)
                candidates.append((rmod.get_function(f"gather_rows<{d4}, {w}, {pf}>"),
                                   max(1, -(-warps // (block // 32))), block, rargs))
        stream_best = max(n_idx * 16 * d4 / (_launch_ms(fn, grid, block, a, comm) * 1e6)
                          for fn, grid, block, a in candidates)
        best = max(best, stream_best)
        if rates is not None:
            rates.append(stream_best)
    del table, streams, out
    torch.cuda.empty_cache()
    return best


def csr_rows_orders(p, kind, dim: int) -> list:
    """[the order csr_rows takes plan p's local entries in at width `dim` in one pass] (default
    knobs otherwise), for gather_bandwidth's floor; [] where csr_rows does not run the plan alone
    (remote work). One pass: a bare gather carries no output, so an order of S source-segment
    passes is a candidate only with the output passes it needs (segmented_gather_ms); taken here
    without them (whenever csr_rows runs in segments) it would make the sum kind's floor
    low by those passes."""
    if p.num_remote_edges or not p.num_local_edges:
        return []
    from mgg.kernels.local_csr import CsrRowsExecutor

    ex = CsrRowsExecutor(p, None, kind, source_segments=1)
    return [ex.visit_order(dim)]


def floor_bytes(p, dp: int) -> dict:
    """Bytes of one aggregation of width `dp` (padded floats) over plan `p`, whatever the kernel.

    compulsory (must come from HBM at least once): an int32 source index per edge (the weights of
    sum / mean / gcn factor into per-row and per-column vectors, so no per-edge weight is
    compulsory), the int64 row pointers of the local and the remote CSR, each table row read once
    (every distinct local source row; with a self term every row, as each row reads its own), the
    output. gathered: every source row an output row sums, its own row included with a self term
    (most of it can hit L2). remote: each unique remote row once over NVLink (the halo)."""
    row = dp * 4
    uniq = len(np.unique(p.local_indices)) if p.num_local_edges else 0
    ptrs = 8 * (p.n_local + 1) * (2 if p.num_remote_edges else 1)
    compulsory = (4 * (p.num_local_edges + p.num_remote_edges) + ptrs
                  + row * ((p.n_local if p.has_self else uniq) + p.n_local))
    self_rows = p.n_local if p.has_self else 0
    return {"compulsory": compulsory, "gathered": row * (p.num_local_edges + p.num_remote_edges + self_rows),
            "remote": row * p.halo_size}


def with_self_entries(indptr, indices) -> tuple[np.ndarray, np.ndarray]:
    """The CSR of A + I from A's (int64 indptr [n + 1], int [E] indices): each row's own index
    appended after its entries. Returns (int64 [n + 1], int32 [E + n])."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n = len(indptr) - 1
    out_ptr = indptr + np.arange(n + 1, dtype=np.int64)
    out = np.empty(int(out_ptr[-1]), dtype=np.int32)
    is_self = np.zeros(len(out), dtype=bool)
    is_self[out_ptr[1:] - 1] = True
    out[is_self] = np.arange(n, dtype=np.int32)
    out[~is_self] = np.asarray(indices)
    return out_ptr, out


def csr_rows_gather_ms(p, kind, dim: int, comm, hbm_GBps: float | None = None,
                       schedules: tuple[dict, ...] = ()) -> float | None:
    """ms of a bare gather in csr_rows' own schedule: plan p's csr_rows call (default knobs; a
    column-mode plan on an already scaled table, so no pre-scale pass) built with
    MGG_CSR_GATHER_ONLY, every store predicated off -- it reads each entry's row and, with a
    self term, each row's own, and writes nothing. In S > 1 source-segment passes the adding
    passes still read the output, and the S - 1 writes beyond one are added at `hbm_GBps` (as
    segmented_gather_ms counts them; without hbm_GBps such a schedule is no candidate: None).
    None where csr_rows does not run the plan alone (remote work) or has nothing to read. On
    one H100 csr_rows read reddit-like D = 64 faster than every flat or row-walking bare gather
    (110% of that floor): its bundles of neighbouring rows keep a table just above the L2's size
    in it better.

    `schedules`: further csr_rows knob sets (CsrRowsExecutor.retune keyword dicts, e.g. the
    mappings bench/local_csr.py times) whose bare gathers are timed too; the fastest is returned,
    so that every schedule a bench row runs is itself a candidate (reddit-like D = 64 sum read
    101.3% of a floor that timed only the default knobs, with bundle window 0 the row that beat
    it; one H200, bench/results/2026-11-27-h200x1-ad8b166 c1)."""
    if p.num_remote_edges or not p.num_local_edges:
        return None
    import cupy as cp
    import torch

    from mgg.kernels.build import build_cubin
    from mgg.kernels.local_csr import CsrRowsExecutor

    ex = CsrRowsExecutor(p, None, kind)
    ex.module = cp.RawModule(path=build_cubin("local_csr", nvshmem=False, defines=("MGG_CSR_GATHER_ONLY",)).path)
    x = torch.randn(p.n_local, dim, device="cuda", generator=_cuda_gen())
    scaled = ex.can_prescale  # column weights: read the table as if scaled (w = 1), no pass
    best = None
    for knobs in ({}, *schedules):
        if knobs:
            ex.retune(**knobs)
        ms = gpu_ms(lambda: ex.aggregate_local(x, None, scaled_input=scaled), comm=comm)
        segments = ex.segments_for(dim)
        if segments > 1:
            if not hbm_GBps:
                continue
            ms += (segments - 1) * p.n_local * padded_dim(dim) * 4 / (hbm_GBps * 1e6)
        best = ms if best is None else min(best, ms)
    del ex, x
    torch.cuda.empty_cache()
    return best


#: source-segment counts the gather floor also times (segmented_gather_ms)
FLOOR_SEGMENTS = (2, 3, 4, 6)


def segmented_gather_ms(idx, n: int, dim: int, hbm_GBps: float, comm) -> dict:
    """The floor of an aggregation that reads the entries of a CSR (idx: int [E] source rows into
    an [n, dim] table, in row order) in S passes over source ranges (the
    order of mgg.kernels.source_segments): per S in FLOOR_SEGMENTS, the bare gather of the
    stream in that order (gather_bandwidth's flat shapes: each pass's rows are a table S times
    smaller, more of it in L2) plus the output passes it needs beyond one write -- S - 1 reads
    and S - 1 writes of the n output rows -- at the HBM copy bandwidth. Returns {S: ms}."""
    import torch

    from mgg.kernels.source_segments import source_segment_order

    row = padded_dim(dim) * 4
    ix = torch.from_numpy(np.asarray(idx).astype(np.int32))
    out = {}
    for S in FLOOR_SEGMENTS:
        order = source_segment_order(ix, n, S)
        rate = gather_bandwidth(dim, comm, indices=ix[order].numpy(), table_rows=n)
        out[S] = row * len(ix) / (rate * 1e6) + (2 * S - 2) * n * row / (hbm_GBps * 1e6)
    return out


def gather_floor(p, kind, dim: int, comm, rates: list | None = None, hbm_GBps: float | None = None,
                 schedules: tuple[dict, ...] = ()) -> dict:
    """The gather floor of one aggregation of plan `p` at width `dim`: the fastest bare gather
    measured of the rows the aggregation reads -- every entry's source row and, with a self
    term, every row's own (the stream of A + I: with_self_entries; sequential self rows come at
    the rate they get). Candidates: gather_bandwidth's kernels on that stream (flat slices,
    moving windows, row walks; for the plain stream also csr_rows' order) and csr_rows' own
    schedule with its stores off (csr_rows_gather_ms, its segment passes' output writes added).
    Remote entries count at the local
    stream's rate. Returns ms, the GB/s it is taken at, and with a self term `without_self_ms`
    (the plain stream's floor, for comparison); the bytes are floor_bytes' "gathered". `rates`:
    gets each stream's best GB/s (gather_bandwidth), then csr_rows' own (GB/s of the same rows).
    With `hbm_GBps` (a plan without remote work), the source-segmented orders are candidates too
    (segmented_gather_ms, their extra output passes included): `segmented_ms` {S: ms}. A kernel
    may take its entries in any order, so the floor is the best of all. `schedules`: csr_rows
    knob sets whose bare gathers are candidates too (csr_rows_gather_ms)."""
    row = padded_dim(dim) * 4
    remote = row * p.num_remote_edges
    rate = gather_bandwidth(dim, comm, indices=p.local_indices, table_rows=p.n_local,
                            orders=csr_rows_orders(p, kind, dim), rates=rates, indptr=p.local_indptr)
    local = row * p.num_local_edges
    out = {"ms": local / (rate * 1e6), "GBps": rate}
    if p.has_self and p.n_local:
        out["without_self_ms"] = out["ms"]
        ptr, idx = with_self_entries(p.local_indptr, p.local_indices)
        local = row * len(idx)
        self_rate = gather_bandwidth(dim, comm, indices=idx, table_rows=p.n_local, rates=rates, indptr=ptr)
        out.update(ms=local / (self_rate * 1e6), GBps=self_rate)
    own = csr_rows_gather_ms(p, kind, dim, comm, hbm_GBps, schedules)
    if own is not None:
        if rates is not None:
            rates.append(local / (own * 1e6))
        if own < out["ms"]:
            out.update(ms=own, GBps=local / (own * 1e6))
    if hbm_GBps and not p.num_remote_edges and p.num_local_edges:
        idx = with_self_entries(p.local_indptr, p.local_indices)[1] if p.has_self else p.local_indices
        out["segmented_ms"] = segmented_gather_ms(idx, p.n_local, dim, hbm_GBps, comm)
        best = min(out["segmented_ms"].values())
        if best < out["ms"]:
            out.update(ms=best, GBps=local / (best * 1e6))
    out["ms"] += remote / (rate * 1e6)
    return out


def agg_floor(dg, kind, dim, bw, comm, reps=20, wanted: tuple[str, ...] | None = None):
    """Per variant: aggregation ms against two lower bounds (max over ranks): compulsory HBM bytes
    / HBM bandwidth (+ remote bytes / NVLink bandwidth) and gathered bytes / the rate the best
    bare gather-sum gets on this plan's own index stream at this width (gather_bandwidth), both
    measured in this run. (A streaming read of an L2-resident buffer was tried as a third bound:
    8.1-8.6 TB/s on an H200, below the 8.9 TB/s the bare gather gets on reddit-like, whose hub
    rows also hit L1, so it bounded nothing.)"""
    import torch

    p = dg.plan(kind)
    dp = padded_dim(dim)
    gf = gather_floor(p, kind, dim, comm, hbm_GBps=bw["hbm_GBps"])
    b = floor_bytes(p, dp)  # the same for every variant (np.unique over the plan's entries: once)
    nv = b["remote"] / (bw["nvlink_GBps"] * 1e6) if b["remote"] else 0.0
    hbm_max = comm.allreduce_scalar(b["compulsory"] / (bw["hbm_GBps"] * 1e6) + nv, "max")
    l2_max = comm.allreduce_scalar(gf["ms"], "max")
    x = torch.randn(dg.n_local, dim, device=dg.device, generator=_cuda_gen())
    rows = []
    for v in variants_for(dg, wanted):
        dg.set_variant(v)
        dg.aggregate(x, kind)
        ms = statistics.median(cuda_ms(lambda: dg.aggregate(x, kind), reps, comm))
        ms_max = comm.allreduce_scalar(ms, "max")
        rows.append({"variant": v, "agg_ms": ms_max, "hbm_floor_ms": hbm_max, "l2_floor_ms": l2_max,
                     "floor_ms": max(hbm_max, l2_max), "gather_GBps": gf["GBps"],
                     "compulsory_bytes": comm.allreduce_scalar(float(b["compulsory"]), "max"),
                     "gathered_bytes": comm.allreduce_scalar(float(b["gathered"]), "max"),
                     "remote_bytes": comm.allreduce_scalar(float(b["remote"]), "max")})
    dg.set_variant("pipelined")
    return rows


def run(args) -> None:
    import torch

    from mgg.apps.loop import ROW_SET_MAX_SHARE
    from mgg.runtime import DistGraph, RuntimeConfig, world

    comm = world()
    torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    P = comm.size
    if P > 1 and args.nccl:
        import torch.distributed as tdist

        addr = comm.bcast(socket.gethostbyname(socket.gethostname()) if comm.rank == 0 else None)
        port = comm.bcast(29500 + int(time.time()) % 1000 if comm.rank == 0 else None)
        tdist.init_process_group("nccl", init_method=f"tcp://{addr}:{port}", rank=comm.rank, world_size=P,
                                 device_id=device)
    bw = bandwidths(comm)
    if "nvlink_GBps" not in bw:
        bw["nvlink_GBps"] = float("nan")
    log(comm, f"P={P} GPU={torch.cuda.get_device_name()} HBM copy {bw['hbm_GBps']:.0f} GB/s, "
              f"GPU0->GPU1 copy {bw['nvlink_GBps']:.0f} GB/s")
    results = {"gpu": torch.cuda.get_device_name(), "P": P, "command": " ".join(sys.argv),
               "date": _dt.datetime.now().isoformat(timespec="seconds"), "bandwidth": bw, "runs": []}
    from bench.baselines import NcclHaloGraph, SingleGpuGraph

    user_tall_gemm = os.environ.get("MGG_TALL_GEMM")  # what a "+cublas" row overrides for itself
    for spec in args.datasets.split(","):
        name, scale, order = parse_dataset(spec)
        g = load_graph(name, scale, args.cache, comm, order)
        name, sc = g.name, scale
        t = time.perf_counter()
        dg = DistGraph.build(g, comm, RuntimeConfig(args.ps, args.dist, args.wpb, backend="gpu"))
        layers = max(model_spec(mn)["layers"] for mn in args.models.split(","))
        sets = dg.register_layer_rows("train", np.nonzero(dg.local(g.train_mask))[0], layers,
                                      ROW_SET_MAX_SHARE)  # as `mgg.train` does
        dg.bench_train_rows = sets if sets[-1] is not None else None
        for kind in sorted({"gcn"} | {model_spec(mn)["kind"] for mn in args.models.split(",")}):
            dg.plan(kind), dg.plan(kind, True)
        dg.num_nodes = g.num_nodes
        from mgg.kernels.gpu import choose_variant

        log(comm, f"== {name} scale {sc}: N={g.num_nodes} E={g.num_edges} F={g.x.shape[1]}; plans "
                  f"{time.perf_counter() - t:.1f} s; rank0 {dg.plan('gcn').stats()}; "
                  f"auto variant: {choose_variant(dg.plan('gcn'))}")
        for mname in args.models.split(","):
            m = model_spec(mname)
            if m["cublas"]:
                os.environ["MGG_TALL_GEMM"] = "0"
            elif user_tall_gemm is None:
                os.environ.pop("MGG_TALL_GEMM", None)
            else:
                os.environ["MGG_TALL_GEMM"] = user_tall_gemm
            row = {"dataset": name, "scale": float(sc or 1), "nodes": g.num_nodes, "edges": g.num_edges,
                   "model": mname, "systems": {}, "errors": {}}
            try:  # an accounting failure must not cost the timings below (it raises the same on every rank)
                traffic = epoch_traffic(dg, mname, g, comm, device, args.input_cache != "off")
                nv_bytes = comm.allreduce_scalar(float(traffic["nvlink_bytes"]), "max")
                row["traffic"] = {"aggregations": traffic["calls"], "nvlink_bytes_max_rank": nv_bytes,
                                  "nvlink_floor_ms": nv_bytes / (bw["nvlink_GBps"] * 1e6) if P > 1 else 0.0}
            except Exception as e:  # noqa: BLE001
                row["errors"]["traffic"] = f"{type(e).__name__}: {e}"
            torch.cuda.reset_peak_memory_stats(device)
            for v in variants_for(dg, args.variants):
                dg.set_variant(v)
                graph_row = {} if args.cuda_graph else None
                ms, err = time_system(lambda: dg, mname, g, comm, args, device, graph_row)
                row["systems"][f"mgg-{v}"] = ms
                if err:
                    row["errors"][f"mgg-{v}"] = err
                if graph_row:
                    row["systems"][f"mgg-{v}+cudagraph"] = graph_row["ms"]
                    if graph_row["error"]:
                        row["errors"][f"mgg-{v}+cudagraph"] = graph_row["error"]
                if args.input_cache == "both":  # the same variant aggregating the input every step
                    ms, err = time_system(lambda: dg, mname, g, comm, args, device, input_cache=False)
                    row["systems"][f"mgg-{v}-nocache"] = ms
                    if err:
                        row["errors"][f"mgg-{v}-nocache"] = err
            dg.set_variant("pipelined")
            heap = sum(a.rows_per_pe * a.dim_padded * 4 for a in dg._arrays.values() if hasattr(a, "dim_padded"))
            row["memory_mb"] = {  # mgg's runs only (the baselines below come after this reading)
                "torch_peak_max_rank": comm.allreduce_scalar(torch.cuda.max_memory_allocated(device) / 2**20, "max"),
                "symmetric_heap_max_rank": comm.allreduce_scalar(heap / 2**20, "max")}
            if P > 1 and args.nccl:
                nccl_G = [None]

                def mk():
                    nccl_G[0] = NcclHaloGraph(dg, kinds=(m["kind"],))
                    nccl_G[0].num_nodes = g.num_nodes
                    return nccl_G[0]
                ms, err = time_system(mk, mname, g, comm, args, device)
                row["systems"]["nccl-halo+spmm"] = ms
                if err:
                    row["errors"]["nccl-halo+spmm"] = err
                nccl_G[0] = None
            if P == 1 and not m["mgg_only"]:  # "+unfused", "+cublas" change mgg's model only: baselines once
                def mk1():
                    s = SingleGpuGraph(g, device, kinds=(m["kind"],))
                    s.num_nodes = g.num_nodes
                    return s
                ms, err = time_system(mk1, mname, g, comm, args, device)
                row["systems"]["torch-sparse-1gpu"] = ms
                if err:
                    row["errors"]["torch-sparse-1gpu"] = err
                ms, err = plain_torch_epoch(g, mname, args, device, comm)
                row["systems"]["torch-plain-1gpu"] = ms
                if err:
                    row["errors"]["torch-plain-1gpu"] = err
                ms, err = pyg_epoch(g, mname, args, device, comm) if args.pyg else (None, "skipped")
                row["systems"]["pyg-1gpu"] = ms
                if err:
                    row["errors"]["pyg-1gpu"] = err
            if not m["mgg_only"]:
                row["aggregation"] = agg_floor(dg, m["kind"], m["hidden"], bw, comm, wanted=args.variants)
            row["systems"] = {k: (comm.allreduce_scalar(v, "max") if v is not None else None)
                              for k, v in row["systems"].items()}
            results["runs"].append(row)
            log(comm, json.dumps({k: row[k] for k in ("dataset", "model", "systems", "errors")}))
        dg.close()
        del g
    if comm.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        gpu = results["gpu"].replace(" ", "_").replace("/", "_")
        path = os.path.join(args.out, f"fullgraph-{gpu}-P{P}-{_dt.datetime.now():%Y%m%d-%H%M%S}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
        print_table([results])
    if P > 1 and args.nccl:
        import torch.distributed as tdist

        tdist.destroy_process_group()


def fmt(v):
    return "-" if v is None else f"{v:.2f}"


def print_table(docs: list[dict]) -> None:
    """One table: epoch ms per system, speedups vs baselines and vs our P=1, aggregation vs floor."""
    one = {}
    for d in docs:
        if d["P"] == 1:
            for r in d["runs"]:
                one[(r["dataset"], r["model"])] = r["systems"]
    print("\nepoch ms (median) | speedups of mgg-pipelined and of the best mgg variant over each system")
    for d in sorted(docs, key=lambda d: d["P"]):
        for r in d["runs"]:
            s = r["systems"]
            ours = s.get("mgg-pipelined")
            best = min((v for k, v in s.items() if k.startswith("mgg-") and v), default=None)
            base = one.get((r["dataset"], r["model"]), {})
            cells = [f"{k}={fmt(v)}" for k, v in s.items()]
            base_best = min((v for k, v in base.items() if k.startswith("mgg-") and v), default=None)
            for label, t in (("pipelined", ours), ("best", best)):
                if not t:
                    continue
                sp = [f"x{s[k] / t:.2f} vs {k}" for k in ("nccl-halo+spmm", "mgg-nonpipelined", "torch-plain-1gpu",
                                                           "torch-sparse-1gpu", "pyg-1gpu") if s.get(k)]
                if d["P"] > 1 and label == "best" and base_best:
                    sp.append(f"x{base_best / t:.2f} vs best P=1")
                if sp:
                    cells.append(f"[{label}: " + ", ".join(sp) + "]")
            print(f"P={d['P']} {r['dataset']:>14} {r['model']}: best mgg {fmt(best)} | " + "  ".join(cells))
            for e, msg in r.get("errors", {}).items():
                print(f"      {e}: {msg}")
            for a in r.get("aggregation", []):
                if "hbm_floor_ms" not in a:  # results written before the two-floor accounting
                    print(f"      agg {a['variant']:>15}: {a['agg_ms']:.3f} ms, old single floor {a['floor_ms']:.3f} ms")
                    continue
                print(f"      agg {a['variant']:>15}: {a['agg_ms']:.3f} ms | HBM floor {a['hbm_floor_ms']:.3f} ms "
                      f"({a['hbm_floor_ms'] / a['agg_ms'] * 100:.0f}%) | gather floor {a['l2_floor_ms']:.3f} ms "
                      f"({a['l2_floor_ms'] / a['agg_ms'] * 100:.0f}% at {a['gather_GBps']:.0f} GB/s)"
                      + floor_note(a['l2_floor_ms'], a['agg_ms']))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="reddit-like:1,products-like:1,papers-like:0.02")
    ap.add_argument("--models", default="gcn,gin")
    ap.add_argument("--variants", default=None, type=_variant_list,
                    help="comma list of kernel variants to time (default: every benched variant of "
                    "mgg/kernels/variants.py); e.g. csr_rows,halo at P = 1 on large graphs")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ps", type=int, default=16)
    ap.add_argument("--dist", type=int, default=4)
    ap.add_argument("--wpb", type=int, default=4)
    ap.add_argument("--cuda-graph", action="store_true",
                    help="also time each mgg variant's step captured in a CUDA graph (mgg-V+cudagraph; at P > 1 with the NVSHMEM barriers inside)")
    ap.add_argument("--input-cache", choices=("on", "off", "both"), default="on",
                    help="mgg's models (and the baselines running mgg's model) start the first layer from "
                    "its input's aggregation computed once (on, the model default), aggregate every step "
                    "(off), or both: each mgg variant also timed without it (mgg-V-nocache)")
    ap.add_argument("--tf32", action="store_true",
                    help="float32 matmuls on TF32 tensor cores for every system of the run (torch's "
                    "'high' precision, as mgg.train --tf32); default IEEE float32")
    ap.add_argument("--no-nccl", dest="nccl", action="store_false")
    ap.add_argument("--no-pyg", dest="pyg", action="store_false")
    ap.add_argument("--cache", default=os.environ.get("MGG_BENCH_CACHE", "/tmp/mgg-graphs"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--summarize", nargs="*", default=None, help="print the table of these result files")
    args = ap.parse_args()
    if args.summarize is not None:
        files = [f for pat in (args.summarize or [os.path.join(args.out, "fullgraph-*.json")]) for f in glob.glob(pat)]
        print_table([json.load(open(f)) for f in sorted(files)])
        return
    if args.tf32:
        import torch

        torch.set_float32_matmul_precision("high")
        print("float32 matmuls on TF32 tensor cores (--tf32), for every system", flush=True)
    run(args)


if __name__ == "__main__":
    main()
