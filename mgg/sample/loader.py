"""`NeighborLoader`: sampled mini-batches over seed nodes, data-parallel across ranks.

Every rank holds the global CSR (the runtime loads the whole graph on every rank), the training
nodes of all ranks (the same array everywhere) and a `FeatureSource`. One epoch:

    1. order the training nodes (seeded by (seed, epoch): the same order on every rank), cut the
       order into S global batches and take this rank's share of each (mgg.sample.batching);
    2. per batch, per layer (fanouts[0] is the hop from the seeds): sample_neighbors of the
       current node set -> Fused-Map (dedup + global->local ids) -> one Block;
    3. (reorder=True) all batches of the epoch are sampled first and run in Match-Reorder order;
    4. gather the input features of n_id (reuse=True: rows resident from the previous batch are
       copied, only the others are fetched), and the labels of the seeds.

Prefetch (CUDA, `prefetch=True`, the default there): a background thread makes the batches ahead
of the caller (at most PREFETCH_DEPTH ready and one in the making) on two side CUDA streams: the
sampling on the *sample stream*, the feature gather (host-tier reads over PCIe / C2C, or remote
gets from the store) on the *gather stream*, which waits for the sampling by an event. So the
sampling's host synchronisations (sizes of the sampled sets) wait for sampling kernels only, the
host work of making batch i+1 runs beside the caller's Python/autograd work on batch i (PyTorch
releases the GIL inside its ops and synchronisations), and the gather kernels run beside the
caller's kernels (the zero-copy gather is capped at a few blocks per SM so that both fit). The
hand-off makes the caller's stream wait for an event recorded after the batch's gather and marks
its tensors as used by the caller's stream (`record_stream`), so the caching allocator never
recycles them early. An exception in the thread is raised in the caller; leaving the loop early
stops the thread. The batches are the same with and without prefetch (one thread makes them, in
order, with the same generator). On the CPU there is no second engine to overlap with (the
gather and the compute share the cores), so the flag changes nothing there.

Data parallelism (mgg.sample.batching): `batch_size` B counts seeds per rank and step; the step's
global batch holds G = P * B seeds, S = ceil(n / G) steps per epoch on every rank (drop_last:
floor(n / G)), and rank r takes the r-th of P nearly equal contiguous parts of every global batch.
The global batches depend on (n, G, seed, epoch) only, not on P. Every step every rank has a
batch (possibly empty), so the gradient all-reduce of the training loop always matches up.
Sampling (seeded by (seed, epoch, rank)) and gathering are not collective.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..nn.indexed_rows import IndexedRows
from .batching import BatchPlan, epoch_order, seeds_fingerprint
from .block import Block, SampledBatch
from .features import FeatureSource, TensorFeatures
from .gpu_blocks import sample_blocks_cuda
from .idmap import fused_map, unique_map
from .neighbor import check_fanouts, place_adjacency, sample_neighbors
from .reorder import MATCH_METRICS, ResidentCache, fetch_cost, match_reorder, overlap_matrix

__all__ = ["NeighborLoader", "EpochStats", "sample_blocks", "PREFETCH_DEPTH"]

#: batches a prefetching loader keeps ready ahead of the caller (plus one in the making)
PREFETCH_DEPTH = 2
#: CUDA priority of the prefetch thread's sampling stream (lower is higher; torch maps it into
#: the device's range): sampling is latency-bound, the caller's training throughput-bound
SAMPLE_STREAM_PRIORITY = -1
_END = object()


def _check_ids(a: Any, name: str, num_nodes: int) -> np.ndarray:
    arr = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    if arr.dtype == bool:
        raise ValueError(f"{name} must be integer node ids, got a boolean array (use np.flatnonzero(mask))")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of node ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integer node ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= num_nodes):
        bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
        raise ValueError(f"{name} out of range [0, {num_nodes}): found {bad}")
    return arr


def sample_blocks(indptr, indices, seeds: torch.Tensor, fanouts: Sequence[int], generator: torch.Generator,
                  id_map: str = "fused") -> tuple[torch.Tensor, list[Block]]:
    """Sample the L-layer message-flow graph of `seeds` (int64 [B], unique).

    fanouts[0] is the hop from the seeds (the last GNN layer), fanouts[-1] the hop to the input
    nodes, as in PyG's `num_neighbors`. Every hop samples for all nodes of the current set.
    Returns (n_id int64 [U], blocks input layer first). On the GPU with the Fused-Map id map this
    is `sample_blocks_cuda` (one host synchronisation a batch with fanouts >= 1, same batches).
    """
    if id_map == "fused" and isinstance(indptr, torch.Tensor) and indptr.is_cuda:
        nodes, blocks = sample_blocks_cuda(indptr, indices, seeds, fanouts, generator)
        return nodes, _with_degrees(indptr, nodes, blocks)
    fn = fused_map if id_map == "fused" else unique_map
    nodes = seeds
    blocks: list[Block] = []
    for f in fanouts:
        ptr, nbr = sample_neighbors(indptr, indices, nodes, f, generator)
        n_dst = int(nodes.numel())
        n_id, local = fn(torch.cat([nodes, nbr.to(nodes.device)]), n_dst)
        blocks.append(Block(ptr.to(n_id.device), local[n_dst:], int(n_id.numel()), n_dst))
        nodes = n_id
    blocks.reverse()
    return nodes, _with_degrees(indptr, nodes, blocks)


def _with_degrees(indptr, n_id: torch.Tensor, blocks: list[Block]) -> list[Block]:
    """Set every block's `src_degree`: the graph's in-degree of n_id, whose prefixes are the
    blocks' src nodes (one gather a batch)."""
    ip = indptr if isinstance(indptr, torch.Tensor) else torch.from_numpy(np.asarray(indptr, dtype=np.int64))
    ids = n_id.to(ip.device)
    deg = (ip[ids + 1] - ip[ids]).to(n_id.device)
    for b in blocks:
        b.src_degree = deg[: b.n_src]
    return blocks


@dataclass
class EpochStats:
    """What one epoch of a loader did on this rank (bytes = rows * F * 4).

    Attributes:
        steps: batches yielded (== len(loader)). seeds: seeds covered. nodes: sum of |n_id|.
        edges: sampled edges over all blocks.
        rows_fetched / bytes_fetched: feature rows read from the source.
        rows_reused: rows copied from the previous batch's resident features.
        bytes_remote: part of bytes_fetched read from other ranks (one-sided gets).
        bytes_no_reuse: nodes * row bytes (what fetching every batch in full would read).
        bytes_identity_order: with reorder, what reuse alone would read in the sampled (shuffled)
            order; None without reorder.
        sample_ms / gather_ms / reorder_ms: host time spent sampling, gathering features
            (launching, on CUDA), reordering.
        gather_gpu_ms: CUDA only: GPU time of the feature gathers (events around each gather on the
            stream it runs on); None on the CPU.
    """

    epoch: int = 0
    steps: int = 0
    seeds: int = 0
    nodes: int = 0
    edges: int = 0
    rows_fetched: int = 0
    rows_reused: int = 0
    bytes_fetched: int = 0
    bytes_remote: int = 0
    bytes_no_reuse: int = 0
    bytes_identity_order: int | None = None
    sample_ms: float = 0.0
    gather_ms: float = 0.0
    reorder_ms: float = 0.0
    gather_gpu_ms: float | None = None
    order: list[int] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "order"}
        return d


class NeighborLoader:
    """Iterate over sampled mini-batches of this rank's seeds (PyG NeighborLoader-like).

    Args:
        graph_csr: (indptr int64 [N+1], indices int64 [E]) global CSR (rows = targets), or an
            object with `.indptr` / `.indices`.
        features: FeatureSource of the input features (an [N, F] array/tensor is wrapped in
            TensorFeatures).
        labels: int64 [N] node labels (-1 for unlabelled nodes); `batch.y` = labels[seeds].
        seeds: the training nodes of *all* ranks (int64, unique), the same array on every rank:
            the loader takes this rank's share of every global batch (module doc).
        fanouts: per-layer fanouts, fanouts[0] for the hop from the seeds; each >= 1 or -1 (all).
        batch_size: seeds per rank and step (>= 1); a step's global batch holds up to P times as
            many.
        shuffle: reorder the seeds every epoch. drop_last: only full global batches.
        reorder: Match-Reorder the batches of every epoch (samples the epoch up front).
        reuse: reuse the previous batch's resident features.
        seed: base seed of shuffling and sampling (epoch e of rank r uses (seed, e, r)).
        device: where batches live; "cuda" samples with the GPU kernels (mgg.kernels.sample_gpu).
        comm: Communicator of the data-parallel ranks (None: this process alone). Construction
            is then collective: the ranks check that they were given the same seeds.
        id_map: "fused" (Fused-Map hash) or "unique" (torch.unique sort chain baseline).
        adjacency_budget: bytes of GPU memory the CSR indices may take (0: no limit); above it they
            stay in pinned host memory (CUDA only).
        prefetch: make the next batches in a background thread on side CUDA streams while the
            caller computes (see the module doc); None: on for CUDA devices. Ignored on the CPU.
        index_features: without `reuse`, give `batch.x` as mgg.nn.IndexedRows(table, n_id) when
            the features are one table on this device (`FeatureSource.table()`: one rank):
            nothing is gathered, the model's first layer reads the table through the index
            (mgg.nn.block_sum). Else, and by default, the gathered rows.
    Raises:
        ValueError naming the argument for bad fanouts, batch sizes, seeds or labels, seeds that
        differ between ranks (on every rank), or drop_last leaving no batch.
    """

    def __init__(self, graph_csr, features, labels, seeds, fanouts: Sequence[int], batch_size: int,
                 shuffle: bool = True, drop_last: bool = False, reorder: bool = False, reuse: bool = True,
                 seed: int = 0, device: torch.device | str = "cpu", comm=None, id_map: str = "fused",
                 reorder_metric: str = "intersection", adjacency_budget: int = 0,
                 prefetch: bool | None = None, index_features: bool = False):
        indptr, indices = (graph_csr.indptr, graph_csr.indices) if hasattr(graph_csr, "indptr") else graph_csr
        indptr_np = np.asarray(indptr.cpu() if isinstance(indptr, torch.Tensor) else indptr)
        self.num_nodes = int(len(indptr_np) - 1)
        if self.num_nodes < 0:
            raise ValueError("graph_csr: indptr must have N + 1 >= 1 entries")
        self.fanouts = check_fanouts(fanouts, "fanouts")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        if id_map not in ("fused", "unique"):
            raise ValueError(f"id_map must be 'fused' or 'unique', got {id_map!r}")
        if reorder_metric not in MATCH_METRICS:
            raise ValueError(f"reorder_metric must be one of {MATCH_METRICS}, got {reorder_metric!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.seeds = _check_ids(seeds, "seeds", self.num_nodes)
        if len(np.unique(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be unique (a node appears twice)")
        if not isinstance(features, FeatureSource):
            features = TensorFeatures(features, device)
        if features.num_nodes != self.num_nodes:
            raise ValueError(f"features cover {features.num_nodes} nodes, the graph has {self.num_nodes}")
        self.features = features
        self.device = torch.device(device)
        if labels is None:
            raise ValueError("labels must be an int64 [N] array (use -1 for unlabelled nodes)")
        lab = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
        if lab.shape != (self.num_nodes,):
            raise ValueError(f"labels must have shape ({self.num_nodes},), got {lab.shape}")
        self.labels = torch.from_numpy(lab.astype(np.int64)).to(self.device)
        self.indptr, self.indices, self.adjacency_tier = place_adjacency(indptr_np, indices, self.device,
                                                                          adjacency_budget)
        self.shuffle, self.drop_last, self.reorder, self.reuse = bool(shuffle), bool(drop_last), bool(reorder), bool(reuse)
        self.index_features = bool(index_features)
        self.seed, self.id_map, self.reorder_metric = int(seed), id_map, reorder_metric
        self.comm = comm
        self.rank = 0 if comm is None else comm.rank
        self.prefetch = self.device.type == "cuda" if prefetch is None else bool(prefetch) and self.device.type == "cuda"
        size = 1 if comm is None else comm.size
        if size > 1:
            prints = comm.allgather(seeds_fingerprint(self.seeds))
            if len(set(prints)) > 1:
                raise ValueError("seeds differ between ranks: every rank must pass the same training nodes "
                                 "(the loader takes each rank's share of every global batch)")
        self.plan = BatchPlan(len(self.seeds), self.batch_size, size, self.rank, self.drop_last)
        self.steps = self.plan.steps
        if self.drop_last and self.steps == 0:
            raise ValueError(f"drop_last=True leaves no batch: {len(self.seeds)} seeds are fewer than one "
                             f"global batch ({size} ranks x batch_size {self.batch_size})")
        self.cache = ResidentCache()
        self.epoch = 0
        self.stats = EpochStats()
        self.history: list[EpochStats] = []
        self._gpu_events: list = []   # (start, end) CUDA events of this epoch's gathers

    def __len__(self) -> int:
        return self.steps

    def _generator(self, epoch: int) -> torch.Generator:
        """The sampling generator of `epoch` on this rank, seeded by (seed, epoch, rank)."""
        ss = np.random.SeedSequence([self.seed, epoch, self.rank])
        rng_t = ss.spawn(2)[1]
        return torch.Generator().manual_seed(int(rng_t.generate_state(1, np.uint64)[0] >> np.uint64(1)))

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's seeds at every step of `epoch` (len == steps; some may be empty): its share
        of each global batch of the epoch's order (mgg.sample.batching)."""
        order = epoch_order(len(self.seeds), self.seed, epoch, self.shuffle)
        return [self.seeds[order[lo:hi]] for lo, hi in self.plan.shares()]

    def __iter__(self) -> Iterator[SampledBatch]:
        work = self._epoch()
        if not self.prefetch:
            for sample, gather in work:
                yield gather(*sample())
        else:
            yield from self._prefetched(work)
        self._settle_gpu_times()

    def _epoch(self) -> Iterator:
        """One epoch's batches as (sample, gather) thunk pairs: `sample()` returns the arguments of
        `gather(...)`, which returns the SampledBatch. The pairs must run in order (they share the
        sampling generator and the resident cache)."""
        self.epoch += 1
        gen = self._generator(self.epoch)
        self.stats = st = EpochStats(epoch=self.epoch)
        self.history.append(st)
        self.cache.clear()
        self._gpu_events = []
        shares = self.batches(self.epoch)
        flat = torch.from_numpy(np.concatenate(shares) if shares else np.zeros(0, np.int64)).to(self.device)
        seed_batches = list(torch.split(flat, [len(b) for b in shares]))  # one host-to-device copy an epoch
        if self.reorder:
            t0 = time.perf_counter()
            sampled = [sample_blocks(self.indptr, self.indices, b, self.fanouts, gen, self.id_map)
                       for b in seed_batches]
            t1 = time.perf_counter()
            ov = overlap_matrix([n for n, _ in sampled], self.num_nodes)
            order = match_reorder([n for n, _ in sampled], self.reorder_metric, overlap=ov)
            st.sample_ms += (t1 - t0) * 1e3
            st.reorder_ms += (time.perf_counter() - t1) * 1e3
            st.bytes_identity_order = (fetch_cost(ov, range(len(sampled))) if self.reuse
                                       else int(np.trace(ov))) * 4 * self.features.dim
            st.order = order
            for i in order:
                yield (lambda i=i: (seed_batches[i], *sampled[i])), self._finish
        else:
            st.order = list(range(len(seed_batches)))

            def sample(b: torch.Tensor) -> tuple:
                t0 = time.perf_counter()
                n_id, blocks = sample_blocks(self.indptr, self.indices, b, self.fanouts, gen, self.id_map)
                st.sample_ms += (time.perf_counter() - t0) * 1e3
                return b, n_id, blocks

            for b in seed_batches:
                yield (lambda b=b: sample(b)), self._finish

    def _prefetched(self, work: Iterator) -> Iterator[SampledBatch]:
        """Make the batches of `work` in a background thread on the sample and gather streams."""
        # high priority: the sampler's small kernels (and the host waiting on their sizes) are
        # scheduled ahead of the caller's queued training kernels
        sample_stream = torch.cuda.Stream(device=self.device, priority=SAMPLE_STREAM_PRIORITY)
        gather_stream = torch.cuda.Stream(device=self.device)
        caller = torch.cuda.current_stream(self.device)
        sample_stream.wait_stream(caller)  # the loader's tensors were made on the caller's stream
        gather_stream.wait_stream(caller)
        ready: queue.Queue = queue.Queue(maxsize=PREFETCH_DEPTH)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def make_all() -> None:
            try:
                torch.cuda.set_device(self.device)
                with torch.cuda.stream(sample_stream):  # the epoch set-up (and reorder) runs here too
                    for sample, gather in work:
                        args = sample()
                        sampled = torch.cuda.Event()
                        sampled.record(sample_stream)
                        with torch.cuda.stream(gather_stream):
                            gather_stream.wait_event(sampled)
                            _record(_tensors_of(args), gather_stream)
                            batch = gather(*args)
                            done = torch.cuda.Event()
                            done.record(gather_stream)
                        if not put((batch, done)):
                            return
                put(_END)
            except BaseException as e:  # noqa: BLE001 -- re-raised in the caller
                put(e)

        worker = threading.Thread(target=make_all, name="mgg-loader-prefetch", daemon=True)
        worker.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield self._hand_over(*item)
        finally:
            stop.set()
            worker.join()

    def _hand_over(self, batch: SampledBatch, done: "torch.cuda.Event") -> SampledBatch:
        """Make the caller's stream wait for `batch` and keep its memory alive for that stream."""
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(done)
        _record(_tensors_of((batch.n_id, batch.x, batch.y, batch.seeds, batch.blocks)), cur)
        return batch

    def _settle_gpu_times(self) -> None:
        """Sum the gather events of the finished epoch into stats.gather_gpu_ms (CUDA)."""
        if self._gpu_events:
            for _, end in self._gpu_events:
                end.synchronize()
            self.stats.gather_gpu_ms = sum(a.elapsed_time(b) for a, b in self._gpu_events)
            self._gpu_events = []

    def _finish(self, seeds: torch.Tensor, n_id: torch.Tensor, blocks: list[Block]) -> SampledBatch:
        st = self.stats
        t0 = time.perf_counter()
        timed = self.device.type == "cuda"
        if timed:
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record(torch.cuda.current_stream(self.device))
        src = self.features
        # the loader's own ids: seeds checked when it was built, neighbors from the loaded CSR
        if self.reuse:
            x = self.cache.gather(n_id, src, checked=True)
            fetched, reused = self.cache.last_fetched, self.cache.last_reused
            remote = src.last.rows_remote if fetched else 0
        else:
            x = src.rows(n_id, checked=True) if self.index_features else src.gather(n_id, checked=True)
            fetched, reused, remote = int(n_id.numel()), 0, src.last.rows_remote
        if not isinstance(x, IndexedRows):
            x = x.to(self.device)
        if timed:
            ev[1].record(torch.cuda.current_stream(self.device))
            self._gpu_events.append(ev)
        st.gather_ms += (time.perf_counter() - t0) * 1e3
        rb = 4 * src.dim
        batch = SampledBatch(n_id=n_id, blocks=[b.to(self.device) for b in blocks], x=x,
                             y=self.labels[seeds.to(self.labels.device)], seeds=seeds,
                             bytes_fetched=fetched * rb, rows_fetched=fetched, rows_reused=reused,
                             bytes_remote=remote * rb)
        st.steps += 1
        st.seeds += int(seeds.numel())
        st.nodes += int(n_id.numel())
        st.edges += sum(b.num_edges for b in blocks)
        st.rows_fetched += fetched
        st.rows_reused += reused
        st.bytes_fetched += fetched * rb
        st.bytes_remote += remote * rb
        st.bytes_no_reuse += int(n_id.numel()) * rb
        return batch


def _tensors_of(obj) -> Iterator[torch.Tensor]:
    """Every tensor in obj (tensors, Blocks, and tuples / lists of them)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Block):
        yield from obj.tensors()
    elif isinstance(obj, IndexedRows):
        yield from (obj.table, obj.index)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors_of(o)


def _record(tensors, stream: "torch.cuda.Stream") -> None:
    """Tell the caching allocator that `stream` uses these tensors (CUDA ones only)."""
    for t in tensors:
        if t.is_cuda:
            t.record_stream(stream)
