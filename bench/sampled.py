"""Sampled mini-batch training benchmark: mgg.sample vs PyG NeighborLoader + SAGEConv.

    python bench/sampled.py --graph products-like --scale 0.1            # P = 1 (+ PyG, + Fused-Map)
    mpirun -np 2 python bench/sampled.py --graph products-like --scale 0.1 --no-pyg   # P-scaling

Same model everywhere: GraphSAGE (mean), 2 layers, --hidden, fanouts --fanout, --batch-size seeds,
Adam. Reported (rank 0, medians over --epochs after one warmup epoch; times are max over ranks):

* Fused-Map vs torch.unique remapping of the sampled ids of real batches (GPU hash pass vs the
  sort-based unique + inverse), median of 20 calls each;
* mgg epoch time and bytes fetched per epoch for: the symmetric-store tier without and with
  Match-Reorder (previous batch's resident rows reused in both), and the zero-copy host tier
  (features in pinned host memory read by the GPU kernel) -- forced with `tier="host"`; each with
  and without the side-stream prefetch of the next batch (its gather overlapped with compute);
  on the GPU the store tier's gather per rank against its floor, max(HBM bytes / HBM rate,
  NVLink bytes / NVLink rate) at the copy rates measured in the same run (`gather_against_floor`);
* PyG: torch_geometric.loader.NeighborLoader + SAGEConv on one GPU (P = 1 only; skipped with a
  reason when PyG or its sampling backend is missing).

Results: bench/results/sampled-<backend>-P<P>-<date>.json and a table on stdout.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mgg.atomic import atomic_write_json  # noqa: E402
from mgg.data.generators import preset  # noqa: E402
from mgg.nn import allreduce_mean_gradients, broadcast_parameters  # noqa: E402
from mgg.nn.sampled import SampledSAGE  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.graph import make_store  # noqa: E402
from mgg.runtime.partition import partition_ranges  # noqa: E402
from mgg.sample import NeighborLoader, fused_map, make_feature_source, unique_map  # noqa: E402


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_idmap(loader: NeighborLoader, dev: torch.device, batches: int = 4, reps: int = 20) -> dict:
    """Fused-Map vs torch.unique on the concatenated [seeds | sampled ids] of real batches."""
    from mgg.sample import sample_neighbors

    gen = torch.Generator().manual_seed(0)
    res = {"fused_ms": [], "unique_ms": [], "ids": []}
    for b in loader.batches(1)[:batches]:
        seeds = torch.from_numpy(np.ascontiguousarray(b)).to(dev)
        frontier, parts = seeds, [seeds]
        for f in loader.fanouts:  # the ids a 2-hop sample produces, before any dedup
            _, nbr = sample_neighbors(loader.indptr, loader.indices, frontier, f, gen)
            parts.append(nbr)
            frontier = torch.unique(nbr)
        ids = torch.cat(parts)
        for name, fn in (("fused_ms", fused_map), ("unique_ms", unique_map)):
            ts = []
            for _ in range(reps):
                _sync(dev)
                t0 = time.perf_counter()
                fn(ids, int(seeds.numel()))
                _sync(dev)
                ts.append((time.perf_counter() - t0) * 1e3)
            res[name].append(statistics.median(ts))
        res["ids"].append(int(ids.numel()))
    return {"ids_per_batch": int(np.median(res["ids"])), "fused_ms": statistics.median(res["fused_ms"]),
            "unique_ms": statistics.median(res["unique_ms"])}


def time_row_gather(x: np.ndarray, n_id: torch.Tensor, dev: torch.device, reps: int = 20,
                    blocks_per_sm=(1, 2, 4, 8, 32)) -> dict:
    """GPU time of gathering the rows n_id (one real batch) from the host tier (zero-copy kernel
    over the host link, at each grid cap in blocks_per_sm; "host_tier" is the default cap) and
    from GPU memory (index_select): ms and GB/s, median of reps."""
    from mgg.kernels.sample_gpu import HOST_GATHER_BLOCKS_PER_SM, gather_host_rows_cuda
    from mgg.sample import HostTierFeatures

    host = HostTierFeatures(x, None, device=dev)
    x_gpu = torch.from_numpy(x).to(dev)
    rows = n_id.to(dev)
    out = {"rows": int(rows.numel()), "row_bytes": 4 * int(x.shape[1])}
    try:
        caps = sorted(set(blocks_per_sm) | {HOST_GATHER_BLOCKS_PER_SM})
        cases = [(f"host_tier_b{b}", lambda b=b: gather_host_rows_cuda(host.host_tensor, rows, b)) for b in caps]
        cases.append(("gpu_memory", lambda: x_gpu.index_select(0, rows)))
        for name, fn in cases:
            fn()
            ts = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b))
            ms = statistics.median(ts)
            out[f"{name}_ms"] = ms
            out[f"{name}_GBps"] = out["rows"] * out["row_bytes"] / ms / 1e6
        for unit in ("ms", "GBps"):  # the loader's default cap, measured above
            out[f"host_tier_{unit}"] = out[f"host_tier_b{HOST_GATHER_BLOCKS_PER_SM}_{unit}"]
    finally:
        host.close()
    return out


def run_mgg(graph, comm, store, bounds, args, dev, reorder: bool, tier: str, prefetch: bool = True) -> dict:
    fan = [int(f) for f in args.fanout.split(",")]
    feats = make_feature_source(graph.x, store, bounds, comm, device=dev, tier=tier)
    seeds = np.flatnonzero(graph.train_mask)  # every rank's: each takes its share of every global batch
    loader = NeighborLoader((graph.indptr, graph.indices), feats, graph.y, seeds, fan, args.batch_size,
                            reorder=reorder, seed=1, device=dev, comm=comm, prefetch=prefetch)
    torch.manual_seed(0)
    classes = int(graph.y.max()) + 1
    model = SampledSAGE(graph.x.shape[1], args.hidden, classes, layers=len(fan), dropout=0.5).to(dev)
    broadcast_parameters(model, comm)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    times, stats, compute = [], [], []
    cuda = dev.type == "cuda"
    for ep in range(1 + args.epochs):
        comm.barrier()
        t0 = time.perf_counter()
        evs = []
        for batch in loader:
            if cuda:  # GPU time of forward + backward + step (the gather's wait is before e0)
                evs.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                evs[-1][0].record()
            opt.zero_grad()
            out = model(batch.x, batch.blocks)
            loss = torch.nn.functional.cross_entropy(out, batch.y, reduction="sum")
            loss.backward()
            allreduce_mean_gradients(model, comm, batch.batch_size, store)  # the global batch's mean
            opt.step()
            if cuda:
                evs[-1][1].record()
        _sync(dev)
        dt = comm.allreduce_scalar(time.perf_counter() - t0, "max")
        if ep >= 1:
            times.append(dt)
            stats.append(loader.stats.to_dict())
            compute.append(sum(a.elapsed_time(b) for a, b in evs))
    feats.close()
    tot = lambda k: int(comm.allreduce_scalar(float(np.median([s[k] for s in stats])), "sum"))  # noqa: E731
    return {"impl": "mgg", "tier": tier, "reorder": reorder, "prefetch": loader.prefetch, "steps": len(loader),
            "epoch_s": float(np.median(times)), "bytes_fetched": tot("bytes_fetched"),
            "bytes_remote": tot("bytes_remote"), "bytes_no_reuse": tot("bytes_no_reuse"),
            "rows_reused": tot("rows_reused"),
            "sample_ms": float(np.median([s["sample_ms"] for s in stats])),
            "gather_ms": float(np.median([s["gather_ms"] for s in stats])),
            "reorder_ms": float(np.median([s["reorder_ms"] for s in stats])),
            "gather_gpu_ms": float(np.median([s["gather_gpu_ms"] for s in stats])) if cuda else None,
            "compute_gpu_ms": float(np.median(compute)) if cuda else None}


def tier_of(run: str) -> str:
    """The feature tier of a --runs entry ("store", "host", with +reorder / +noprefetch)."""
    return "host" if run.startswith("host") else "store"


def gather_against_floor(r: dict, bw: dict, ranks: int) -> dict:
    """The store tier's feature gather of one epoch against its floor, per rank (the epoch's bytes
    averaged over the ranks): its rate (bytes fetched over the gather's GPU time) and the floor
    max(HBM bytes / HBM rate, NVLink bytes / NVLink rate), HBM bytes = the own rows read plus
    every row written, NVLink bytes = the rows read from other GPUs. `bw`: bench.harness.timing
    bandwidths (the HBM rate counts read and write bytes, as a copy does)."""
    fetched, remote = r["bytes_fetched"] / ranks, r["bytes_remote"] / ranks
    t = r["gather_gpu_ms"] / 1e3
    floor = (2 * fetched - remote) / (bw["hbm_GBps"] * 1e9)
    if remote:
        floor = max(floor, remote / (bw.get("nvlink_GBps", float("inf")) * 1e9))
    return {"gather_GBps": fetched / t / 1e9 if t > 0 else float("nan"), "gather_floor_ms": floor * 1e3,
            "gather_over_floor": t / floor if floor > 0 else float("nan")}


def run_pyg(graph, args, dev, workers: int) -> dict:
    try:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader as PyGLoader
        from torch_geometric.nn import SAGEConv
    except ImportError as e:
        return {"impl": "pyg", "skipped": f"torch_geometric not importable: {e}"}
    fan = [int(f) for f in args.fanout.split(",")]
    tgt = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    data = Data(x=torch.from_numpy(graph.x), y=torch.from_numpy(graph.y),
                edge_index=torch.from_numpy(np.stack([graph.indices, tgt])))
    pipeline = "pyg NeighborLoader"
    try:
        loader = PyGLoader(data, num_neighbors=fan, batch_size=args.batch_size, shuffle=True,
                           input_nodes=torch.from_numpy(np.flatnonzero(graph.train_mask)),
                           num_workers=workers, persistent_workers=workers > 0)
        next(iter(loader))
    except Exception as e:  # noqa: BLE001 - PyG's sampler needs pyg-lib or torch-sparse
        # NeighborLoader's pipeline without its C++ sampler: sample on the host (mgg's vectorised
        # CPU sampler, same fanouts), gather the rows on the host, copy the subgraph to the GPU,
        # run PyG SAGEConv on the union of the sampled edges and keep the seeds' rows
        why = f"{type(e).__name__}: {e}"
        pipeline = f"host-sampling pipeline of NeighborLoader + PyG SAGEConv (PyG's sampler: {why})"
        loader = _HostPipeline(graph, fan, args.batch_size)

    class Net(torch.nn.Module):
        def __init__(self, fin, hid, out):
            super().__init__()
            dims = [fin] + [hid] * (len(fan) - 1) + [out]
            self.convs = torch.nn.ModuleList([SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:])])

        def forward(self, x, ei):
            for i, c in enumerate(self.convs):
                x = torch.nn.functional.dropout(x, 0.5, self.training)
                x = c(x, ei)
                if i < len(self.convs) - 1:
                    x = torch.relu(x)
            return x

    torch.manual_seed(0)
    model = Net(graph.x.shape[1], args.hidden, int(graph.y.max()) + 1).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    times = []
    for ep in range(1 + args.epochs):
        t0 = time.perf_counter()
        for b in loader:
            b = b.to(dev)
            opt.zero_grad()
            out = model(b.x, b.edge_index)[: b.batch_size]
            loss = torch.nn.functional.cross_entropy(out, b.y[: b.batch_size])
            loss.backward()
            opt.step()
        _sync(dev)
        if ep >= 1:
            times.append(time.perf_counter() - t0)
    return {"impl": "pyg", "pipeline": pipeline, "workers": workers, "epoch_s": float(np.median(times)),
            "steps": len(loader)}


class _HostPipeline:
    """NeighborLoader's data path on the host: shuffled seed batches, CPU sampling, CPU feature
    gather; yields PyG-style batches (x, y, edge_index in local ids, batch_size; seeds first)."""

    def __init__(self, graph, fanouts, batch_size):
        from torch_geometric.data import Data

        from mgg.sample import sample_blocks

        self.Data, self.sample_blocks = Data, sample_blocks
        self.g, self.fan, self.bs = graph, fanouts, batch_size
        self.ip, self.ix = torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices)
        self.x, self.y = torch.from_numpy(graph.x), torch.from_numpy(graph.y)
        self.seeds = np.flatnonzero(graph.train_mask)
        self.gen = torch.Generator().manual_seed(0)

    def __len__(self):
        return -(-len(self.seeds) // self.bs)

    def __iter__(self):
        perm = np.random.default_rng(int(torch.randint(0, 2 ** 31, (1,), generator=self.gen))).permutation(self.seeds)
        for i in range(len(self)):
            s = torch.from_numpy(perm[i * self.bs:(i + 1) * self.bs])
            n_id, blocks = self.sample_blocks(self.ip, self.ix, s, self.fan, self.gen, "unique")
            ei = torch.cat([torch.stack([b.col, b.row]) for b in blocks], 1)
            d = self.Data(x=self.x.index_select(0, n_id), y=self.y.index_select(0, n_id), edge_index=ei)
            d.batch_size = int(s.numel())
            yield d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="products-like")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--fanout", default="25,10")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto")
    ap.add_argument("--no-pyg", action="store_true")
    ap.add_argument("--pyg-workers", default="0",
                    help="comma list of NeighborLoader num_workers to run PyG with (persistent workers)")
    ap.add_argument("--runs", default="store,store+noprefetch,store+reorder,host,host+noprefetch",
                    help="mgg runs: store or host, +reorder (Match-Reorder), +noprefetch (no side-stream "
                    "prefetch of the next batch; CUDA only)")
    ap.add_argument("--feat-dim", type=int, default=0,
                    help="replace the preset's features by random ones of this width (0: keep)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the list of runs this many times, interleaved; report medians")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args(argv)
    comm = world()
    gpu = args.backend == "gpu" or (args.backend == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", comm.local_rank % max(1, torch.cuda.device_count())) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(dev)
    graph = preset(args.graph, args.scale, seed=0)
    if args.feat_dim > 0:  # wider features: more bytes per gathered row, same graph and labels
        graph = dataclasses.replace(graph, x=np.random.default_rng(0).standard_normal(
            (graph.num_nodes, args.feat_dim), dtype=np.float32))
    bounds = partition_ranges(graph.indptr, comm.size)
    store = make_store(comm, "gpu" if gpu else "cpu")
    results = []
    say = (lambda *a: print(*a, flush=True)) if comm.rank == 0 else (lambda *a: None)
    say(f"{args.graph}@{args.scale}: {graph.num_nodes} nodes, {graph.num_edges} edges, F={graph.x.shape[1]}, "
        f"train {int(graph.train_mask.sum())}, P={comm.size}, device {dev}")
    runs = [r for r in args.runs.split(",") if r and (gpu or "noprefetch" not in r)]  # CPU: never prefetches
    bw = {}
    if gpu:  # the rates the store gather's floor is taken at, measured in this run
        from bench.harness.timing import bandwidths

        bw = bandwidths(comm)
        say(f"HBM copy {bw['hbm_GBps']:.0f} GB/s, GPU->GPU copy {bw.get('nvlink_GBps', float('nan')):.0f} GB/s")
    by_run: dict[str, list[dict]] = {run: [] for run in runs}
    for _ in range(max(1, args.rounds)):
        for run in runs:
            tier = tier_of(run)
            by_run[run].append(run_mgg(graph, comm, store, bounds, args, dev, reorder="reorder" in run, tier=tier,
                                       prefetch="noprefetch" not in run))
    for run, rounds in by_run.items():
        r = dict(rounds[0], run=run, epoch_s_rounds=[x["epoch_s"] for x in rounds])
        for k in ("epoch_s", "sample_ms", "gather_ms", "reorder_ms", "gather_gpu_ms", "compute_gpu_ms"):
            if r.get(k) is not None:
                r[k] = float(np.median([x[k] for x in rounds]))
        if gpu and tier_of(run) == "store":
            r.update(gather_against_floor(r, bw, comm.size))
        results.append(r)
        say(f"mgg {run:18} epoch {r['epoch_s'] * 1e3:9.1f} ms  steps {r['steps']:4d}  fetched "
            f"{r['bytes_fetched'] / 2**20:9.1f} MiB (no reuse {r['bytes_no_reuse'] / 2**20:9.1f}, remote "
            f"{r['bytes_remote'] / 2**20:8.1f})  sample {r['sample_ms']:7.1f} ms  gather {r['gather_ms']:7.1f} ms"
            + (f"  GPU: gather {r['gather_gpu_ms']:6.1f} ms compute {r['compute_gpu_ms']:6.1f} ms" if gpu else "")
            + (f"  reorder {r['reorder_ms']:6.1f} ms" if r["reorder"] else "")
            + (f"  gather {r['gather_GBps']:.1f} GB/s a rank, {r['gather_over_floor']:.1f}x its floor "
               f"({r['gather_floor_ms']:.1f} ms)" if "gather_GBps" in r else ""))
    for run in runs:  # the prefetch gain, run by run
        if "noprefetch" in run:
            on = next((x for x in results if x.get("run") == run.replace("+noprefetch", "")), None)
            off = next(x for x in results if x.get("run") == run)
            if on is not None:
                say(f"prefetch gain {run.replace('+noprefetch', ''):14} {off['epoch_s'] / on['epoch_s']:.2f}x "
                    f"({off['epoch_s'] * 1e3:.1f} -> {on['epoch_s'] * 1e3:.1f} ms)")
    if comm.rank == 0 and comm.size == 1:
        fan = [int(f) for f in args.fanout.split(",")]
        seeds = np.flatnonzero(graph.train_mask)
        loader = NeighborLoader((graph.indptr, graph.indices), graph.x,
                                graph.y, seeds, fan, args.batch_size, device=dev)
        if gpu:
            first = next(iter(loader))
            g = time_row_gather(graph.x, first.n_id, dev)
            results.append({"impl": "row_gather", **g})
            say(f"row gather ({g['rows']} rows x {g['row_bytes']} B, one batch): host tier {g['host_tier_ms']:.3f} ms "
                f"({g['host_tier_GBps']:.1f} GB/s), GPU memory {g['gpu_memory_ms']:.3f} ms "
                f"({g['gpu_memory_GBps']:.1f} GB/s); host tier by blocks/SM: "
                + ", ".join(f"{k[11:-5]}: {v:.1f}" for k, v in g.items() if k.startswith("host_tier_b") and k.endswith("GBps")))
        im = time_idmap(loader, dev)
        im["speedup"] = im["unique_ms"] / im["fused_ms"]
        results.append({"impl": "idmap", **im})
        say(f"id map ({im['ids_per_batch']} ids/batch): Fused-Map {im['fused_ms']:.3f} ms, torch.unique "
            f"{im['unique_ms']:.3f} ms, {im['speedup']:.2f}x")
        for workers in ([] if args.no_pyg else [int(w) for w in args.pyg_workers.split(",")]):
            r = run_pyg(graph, args, dev, workers)
            results.append(r)
            if "skipped" in r:
                say(f"pyg: skipped ({r['skipped']})")
                break
            base = next(x for x in results if x.get("run") == "store")
            say(f"pyg SAGEConv epoch {r['epoch_s'] * 1e3:9.1f} ms  steps {r['steps']}  workers {workers}  "
                f"pyg/mgg {r['epoch_s'] / base['epoch_s']:.2f}x  [{r['pipeline']}]")
    if comm.rank == 0:
        name = f"sampled-{'gpu' if gpu else 'cpu'}-P{comm.size}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
        os.makedirs(args.out, exist_ok=True)
        atomic_write_json(os.path.join(args.out, name), {
            "graph": args.graph, "scale": args.scale, "nodes": int(graph.num_nodes), "edges": int(graph.num_edges),
            "P": comm.size, "fanout": args.fanout, "batch_size": args.batch_size, "hidden": args.hidden,
            "epochs": args.epochs, "device": torch.cuda.get_device_name(dev) if gpu else platform.processor(),
            "host": platform.node(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), "results": results})
        say(f"wrote {os.path.join(args.out, name)}")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
