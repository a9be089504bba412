"""DistGraph: the runtime context one rank holds for a partitioned graph.

It owns the communicator, the symmetric store, the node ranges, and the plans (per aggregation
kind, forward and transposed), and runs aggregations through the executor of its backend.

The runtime tuner switches configurations (ps, dist, wpb, kernel variant) between iterations
through `set_config`: the partition cuts of the last few ps values stay in a `PlanCache`, and the
executors of the last few configurations stay built (on the GPU: their plans stay uploaded), so
switching back to a configuration costs neither a re-cut nor an upload. `release_unused` frees
both once the tuner has settled.

Layering: this module sits in the graph layer (mgg.graph), above mgg.kernels (its executors come
from mgg.graph.factory) and below mgg.tuning and mgg.nn.
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from .factory import plan_executor
from .gcn_factors import WHOLE, GcnFactors, run_factored
from .rank_rows import RankRows, auto_transpose, host_tensor
from .backends import BACKENDS, make_store, resolve_backend
from ..data.rows import read_rows
from ..knobs import KNOB_DEFAULTS
from ..runtime.comm import Communicator
from ..runtime.gpu_assignment import device_index
from ..runtime.partition import partition_ranges
from ..runtime.plan import AggregationPlan, PlanParams, build_plan
from ..runtime.plancache import PlanCache
from ..runtime.rowset import RowSet, global_row_mask, keep_entries, keep_rows, with_in_neighbours
from ..runtime.store import STORAGE_DTYPES, SymmetricArray, SymmetricStore, storage_torch_dtype
from ..runtime.transfer import host_to_device
from ..runtime.transpose import sort_within_rows, transposed_rows_exchange, transposed_rows_t
from ..runtime.weights import check_kind, diag_weights, pair_weights_by_row

__all__ = ["RuntimeConfig", "DistGraph", "resolve_backend"]


@dataclass
class RuntimeConfig:
    """Runtime knobs. `variant` picks the GPU kernel (mgg.kernels.variants, or "auto"); the CPU ignores it.
    `storage_dtype` ("fp32" | "bf16" | "fp16") is what `aggregate` holds embeddings in inside the
    symmetric store and halo buffers (sums in float32, docs/storage-dtype.md)."""

    ps: int = KNOB_DEFAULTS["ps"]
    dist: int = KNOB_DEFAULTS["dist"]
    wpb: int = KNOB_DEFAULTS["wpb"]
    backend: str = "auto"
    variant: str = "auto"
    ps_inter: int | None = None  # ps of remote partitions on other nodes (None: same as ps)
    partition_beta: float | None = None  # node cost of partition_ranges (None: its default; 0: Algorithm 1)
    storage_dtype: str = "fp32"  # element type of embeddings in the store (STORAGE_DTYPES)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {tuple(STORAGE_DTYPES)}, got {self.storage_dtype!r}")
        self.params  # validates ranges

    @property
    def params(self) -> PlanParams:
        return PlanParams(self.ps, self.dist, self.wpb, self.ps_inter)

    def to_dict(self) -> dict:
        return asdict(self)


class DistGraph:
    """A graph partitioned over the ranks of `comm`, ready to aggregate node features.

    Every rank passes the same global graph; rank r keeps only what its range [lo, hi) needs.
    """

    PLAN_CACHE = 3      # ps values whose partition cuts are kept (PlanCache capacity)
    EXECUTOR_CACHE = 3  # configurations (params, variant) whose executors are kept

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, comm: Communicator,
                 config: RuntimeConfig | None = None, store: SymmetricStore | None = None,
                 transpose: str = "auto"):
        """`transpose`: how the transposed rows are built -- "scan" (every rank scans the global
        `indices`), "exchange" (each rank reads only its forward rows and the edges are sent to
        their sources' owners: `transposed_rows_exchange`), or "auto": "exchange" when `indices`
        is a memory map (np.memmap, e.g. mgg.data.load_npz(mmap=True)), else "scan". Both give
        the same plans. "auto" is `auto_transpose`: "exchange" for a memory map at P > 1 unless
        the ranks have GPUs with room to scan it."""
        t_start = time.perf_counter()
        self.comm = comm
        self.config = config or RuntimeConfig()
        self.backend = resolve_backend(self.config.backend)
        if transpose not in ("auto", "scan", "exchange"):
            raise ValueError(f"transpose must be 'auto', 'scan' or 'exchange', got {transpose!r}")
        if transpose == "auto":
            transpose = auto_transpose(indptr, indices, comm.size, self.backend, comm.local_rank)
        self.transpose_method = transpose
        mapped_indptr = indptr if isinstance(indptr, np.memmap) else None  # uploaded from the file
        indptr = np.asarray(indptr, dtype=np.int64)
        mapped_indices = indices if isinstance(indices, np.memmap) else None  # read by rows, not mapped
        indices = np.asarray(indices, dtype=np.int64)
        self.num_nodes = len(indptr) - 1
        self.num_edges = int(indptr[-1])
        self.bounds = partition_ranges(indptr, comm.size, beta=self.config.partition_beta)
        self.rank, self.world_size = comm.rank, comm.size
        self.lo, self.hi = int(self.bounds[self.rank]), int(self.bounds[self.rank + 1])
        self.rows_per_pe = max(1, int(np.diff(self.bounds).max()))
        self.deg_in = np.diff(indptr)
        self.node_of_pe = comm.node_of_ranks()
        self.device = torch.device("cpu")
        if self.backend == "gpu":
            self.device = torch.device("cuda", device_index(comm.local_rank, torch.cuda.device_count()))
        self.plan_device = self.device  # rows, weights and plans are built here (torch ops)
        self._deg_t = torch.from_numpy(self.deg_in).to(self.plan_device)
        if transpose == "exchange":  # only this rank's forward rows of `indices` are read
            a, b = int(indptr[self.lo]), int(indptr[self.hi])
            rip = torch.from_numpy(indptr[self.lo: self.hi + 1] - a).to(self.plan_device)
            rows = torch.from_numpy(read_rows(mapped_indices if mapped_indices is not None else indices, a, b))
            self._fwd = RankRows(rip, sort_within_rows(rip, rows.to(self.plan_device)), self.lo)
            self._bwd = self._exchanged_rows()
        elif self.plan_device.type != "cpu":  # one upload of the global CSR, for both directions
            # a mapped file is read into the upload's staging buffers, not through the map, so
            # the scan leaves none of its pages in this rank's resident set (runtime.transfer)
            indptr_d, indices_d = (host_to_device(m if m is not None else a, self.plan_device, torch.int64)
                                   for m, a in ((mapped_indptr, indptr), (mapped_indices, indices)))
        else:
            indptr_d, indices_d = indptr, indices
        if transpose == "scan":
            self._fwd: RankRows | None = self._forward_rows(indptr_d, indices_d)
            self._bwd: RankRows | None = self._transposed_rows(indptr_d, indices_d)
            del indptr_d, indices_d
        self.params = self.config.params
        # (kind, transposed, row set name or None) -> plan, for self.params
        self._plans: dict[tuple[str, bool, str | None], AggregationPlan] = {}
        self._row_sets: dict[str, RowSet] = {}
        self._row_masks: dict[str, torch.Tensor] = {}  # global masks until the transposed plans exist
        self.plan_cache = PlanCache(self.PLAN_CACHE)
        # LRU: (params, variant) -> {(kind, transposed, row set): executor}
        self._executors: OrderedDict[tuple[PlanParams, str], dict[tuple[str, bool, str | None], Any]] = OrderedDict()
        self._arrays: dict[tuple[int, torch.dtype], SymmetricArray] = {}
        self._gcn_factor: torch.Tensor | None = None  # gcn_factor(), built on first use
        # (config, kind, transposed, rows) -> whether every rank's executor takes scaled input
        self._scaled_native: dict[tuple, bool] = {}
        t_store = time.perf_counter()
        self.store = store if store is not None else make_store(comm, self.backend)
        #: seconds of this rank's construction: "partition" (ranges and rows), "store"
        self.build_seconds = {"partition": t_store - t_start, "store": time.perf_counter() - t_store}

    @classmethod
    def build(cls, graph: Any, comm: Communicator, config: RuntimeConfig | None = None,
              store: SymmetricStore | None = None, transpose: str = "auto") -> "DistGraph":
        """From an mgg.data.Graph (anything with int64 `indptr` and `indices`). Collective.
        A memory-mapped graph (``graph.mapped``) is scanned whole where the GPU has room, else
        read only at this rank's rows (`auto_transpose`)."""
        return cls(graph.indptr, graph.indices, comm, config, store, transpose)

    # -- rows of this rank --------------------------------------------------------------------
    def _forward_rows(self, indptr: np.ndarray, indices: np.ndarray) -> RankRows:
        dev = getattr(self, "plan_device", torch.device("cpu"))
        if not isinstance(indptr, torch.Tensor):
            indptr, indices = host_tensor(indptr), host_tensor(indices)
        a, b = int(indptr[self.lo]), int(indptr[self.hi])
        rip = (indptr[self.lo: self.hi + 1] - a).to(dev)
        idx = indices[a:b]
        if idx.device.type != "cpu" and idx.numel() != indices.numel():
            idx = idx.clone()  # a device slice would keep the whole global array alive
        return RankRows(rip, sort_within_rows(rip, idx.to(dev)), self.lo)

    def _exchanged_rows(self) -> RankRows:
        """This rank's transposed rows from every rank's forward rows (one all-to-all; collective)."""
        fwd = self._fwd
        with self.comm.guard("transposed rows (exchange)"):
            ip, tgt = transposed_rows_exchange(fwd.indptr.cpu().numpy(), fwd.indices.cpu().numpy(),
                                               self.bounds, self.rank, self.comm)
        dev = self.plan_device
        return RankRows(torch.from_numpy(ip).to(dev), torch.from_numpy(tgt).to(dev), self.lo)

    def _transposed_rows(self, indptr: np.ndarray, indices: np.ndarray,
                         device: str | torch.device | None = None) -> RankRows:
        """Rows of W^T owned here: every edge j -> i whose source j lies in [lo, hi), sorted by
        source then CSR position (a counting sort on the CPU, a radix sort on `device` "cuda")."""
        if device is None:
            device = getattr(self, "plan_device", None)
        ip, tgt = transposed_rows_t(indptr, indices, self.lo, self.hi, device=device)
        return RankRows(ip, tgt, self.lo)

    # -- plans and executors -------------------------------------------------------------------
    @property
    def n_local(self) -> int:
        return self.hi - self.lo

    def local(self, arr):
        """arr[lo:hi] of a global per-node array (numpy array or tensor)."""
        return arr[self.lo: self.hi]

    def register_rows(self, name: str, local_rows) -> RowSet:
        """Name a subset of this rank's rows whose outputs are the only ones read (mgg.runtime.rowset):
        `aggregate(x, kind, rows=set)` then runs W_S over their in-edges only. Collective (every
        rank registers the same names in the same order, before the first plan is built).

        Args:
            name: the subset's name. local_rows: int [k] rows in [0, n_local) (numpy or tensor).
        """
        return self._register(name, local_rows)

    def _register(self, name: str, local_rows, global_mask: torch.Tensor | None = None) -> RowSet:
        """register_rows; `global_mask` (bool [num_nodes] on the plan device: the set over all
        ranks), when the caller has it, saves the all-gather that builds it."""
        if self._fwd is None or self._bwd is None:
            raise RuntimeError(f"register_rows({name!r}): register row sets before the first plan is built")
        if name in self._row_sets:
            raise ValueError(f"register_rows: a row set named {name!r} exists")
        idx = self._local_index(name, local_rows)
        total = int(self.comm.allreduce_scalar(float(idx.numel())))
        rs = RowSet(name, idx.to(self.device), total)
        self._row_masks[name] = (global_mask if global_mask is not None else
                                 global_row_mask(idx, self.lo, self.num_nodes, self.comm, self.plan_device))
        self._row_sets[name] = rs
        return rs

    def _local_index(self, name: str, local_rows) -> torch.Tensor:
        """int64 CPU tensor: the distinct rows of `local_rows` (numpy or tensor), sorted; a row
        outside [0, n_local) -> ValueError naming set `name` and the row."""
        idx = torch.as_tensor(np.asarray(local_rows.cpu() if isinstance(local_rows, torch.Tensor) else local_rows)
                              ).to(torch.int64).reshape(-1)
        bad = idx[(idx < 0) | (idx >= self.n_local)]
        if bad.numel():
            raise ValueError(f"register_rows({name!r}): row {int(bad[0])} is outside this rank's "
                             f"{self.n_local} rows (rank {self.rank})")
        return torch.unique(idx)  # sorted, distinct

    def expand_rows(self, rows: RowSet, name: str) -> RowSet:
        """Register `name` = rows ∪ N_in(rows): every row of the set and every source of an edge
        into it, on the ranks owning them -- the rows a layer must output so that the next
        layer can compute `rows` (mgg.runtime.rowset). Collective (one all-reduce of a node
        mask over the ranks); before the first plan is built."""
        return self._register(name, *self._expansion(rows, name))

    def _expansion(self, rows: RowSet, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(this rank's rows of rows ∪ N_in(rows), that set's mask over all ranks or None on one
        rank): what expand_rows registers. Collective."""
        if self._fwd is None:
            raise RuntimeError(f"expand_rows({name!r}): register row sets before the first plan is built")
        wide, sources = with_in_neighbours(self._fwd.indptr, self._fwd.indices, rows.index.to(self.plan_device),
                                           self.lo, self.hi, self.num_nodes, self.comm)
        everywhere = None if sources is None else self._row_masks[rows.name] | sources
        return torch.nonzero(wide).reshape(-1), everywhere

    def register_layer_rows(self, name: str, local_rows, layers: int, max_share: float = 1.0
                            ) -> tuple[RowSet | None, ...]:
        """The row sets an `layers`-layer model needs to output `local_rows` at its last layer:
        entry l (0-based) holds the rows layer l must compute -- the last one `local_rows`
        (named `name`), each earlier one the expansion (`expand_rows`) of the next (named
        `name.l`). A set holding more than `max_share` of the nodes (over all ranks) is not
        registered (no plans are built for it), and neither are the ones before it (None: every
        row). Collective."""
        if layers < 1:
            raise ValueError(f"register_layer_rows: layers must be >= 1, got {layers}")
        limit = max_share * self.num_nodes
        out: list[RowSet | None] = [None] * layers
        idx, everywhere = self._local_index(name, local_rows), None
        for layer in range(layers - 1, -1, -1):
            label = name if layer == layers - 1 else f"{name}.{layer}"
            if layer < layers - 1:
                idx, everywhere = self._expansion(out[layer + 1], label)
            if self.comm.allreduce_scalar(float(idx.numel())) > limit:
                break  # too wide to pay off: not registered, so no plans are built for it
            out[layer] = self._register(label, idx, everywhere)
        return tuple(out)

    def plan(self, kind: str, transposed: bool = False, rows: str | None = None) -> AggregationPlan:
        """This rank's plan for `kind` (cached). Forward: W; transposed: W^T (backward); with
        `rows` (a registered row set's name) those of W_S (mgg.runtime.rowset).

        The structure (split, partitions, halo) does not depend on the kind: the first plan of a
        direction is built (with the row sets' plans of that direction), the others only
        recompute the weights in plan order.
        """
        check_kind(kind)
        if rows is not None and rows not in self._row_sets:
            raise KeyError(f"no row set named {rows!r} (DistGraph.register_rows)")
        key = (kind, transposed, rows)
        if key not in self._plans:
            same = [p for (k, t, r), p in self._plans.items() if t == transposed and r == rows]
            if same:
                self._plans[key] = self._reweighted(same[0], kind, transposed)
            else:
                self._build_direction(kind, transposed)
        return self._plans[key]

    def _build_direction(self, kind: str, transposed: bool) -> None:
        """The plans of `kind` in one direction, full and per row set, from this rank's rows
        (which are then dropped: later kinds are reweighted from the plans)."""
        rows = self._bwd if transposed else self._fwd
        for name in (None, *self._row_sets):
            ip, idx = rows.indptr, rows.indices
            if name is not None and transposed:  # W_S^T: the entries whose target is in S
                ip, idx = keep_entries(ip, idx, self._row_masks[name][idx])
            elif name is not None:               # W_S: the rows of S
                mask = torch.zeros(self.n_local, dtype=torch.bool, device=self.plan_device)
                mask[self._row_sets[name].index.to(self.plan_device)] = True
                ip, idx = keep_rows(ip, idx, mask)
            # forward entry (row i, col j) carries w(j -> i); transposed (row j, col i) w(j -> i)
            w = pair_weights_by_row(kind, self._deg_t, ip, self.lo, idx, row_is_target=not transposed)
            d = diag_weights(kind, self._deg_t, torch.arange(self.lo, self.hi, device=self.plan_device))
            self._plans[(kind, transposed, name)] = build_plan(ip, idx, w, d, self.bounds, self.rank, self.params,
                                                               self.node_of_pe, device=self.plan_device)
        if transposed:
            self._bwd = None
            self._row_masks.clear()
        else:
            self._fwd = None

    def _reweighted(self, base: AggregationPlan, kind: str, transposed: bool) -> AggregationPlan:
        """`base` with the weights of `kind`: each plan entry is (row node, other endpoint)."""
        dev = self.plan_device

        def weights(indptr: np.ndarray, other: torch.Tensor) -> np.ndarray:
            ip = torch.from_numpy(indptr).to(dev)
            w = pair_weights_by_row(kind, self._deg_t, ip, self.lo, other, row_is_target=not transposed)
            return w.cpu().numpy()

        def up(a: np.ndarray) -> torch.Tensor:  # int64: global ids
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev, torch.int64)

        remote_src = torch.from_numpy(self.bounds).to(dev)[up(base.remote_pe).long()] + up(base.remote_row)
        d = diag_weights(kind, self._deg_t, torch.arange(self.lo, self.hi, device=dev))
        return dataclasses.replace(
            base, local_weight=weights(base.local_indptr, up(base.local_indices) + self.lo),
            remote_weight=weights(base.remote_indptr, remote_src),
            self_weight=np.zeros(self.n_local, np.float32) if d is None else d.cpu().numpy(),
            has_self=d is not None)

    def set_variant(self, variant: str) -> None:
        """Switch the GPU kernel variant (executors are built lazily, or reused from the LRU)."""
        self.set_config(self.params, variant)

    def set_params(self, params: PlanParams) -> None:
        """Re-cut every plan for new (ps, dist, wpb); the local/remote split is kept, and the cuts
        of the last `PLAN_CACHE` ps values are reused instead of recomputed."""
        if params == self.params:
            return
        self.plan_cache.keep(self._plans)  # the current cut, for a later switch back
        self._plans = self.plan_cache.apply(self._plans, params)
        self.params = params

    def set_config(self, params: PlanParams, variant: str | None = None) -> None:
        """Plan knobs and GPU kernel variant at once (the runtime tuner's setter).

        Takes effect at the next `aggregate`; executors of recent configurations are reused.
        """
        if variant is not None:
            self.config.variant = variant
        self.set_params(params)

    def release_unused(self) -> None:
        """Free the cached cuts and the executors of every configuration but the current one."""
        key = self._config_key()
        current = self._executors.get(key)
        self._executors.clear()
        if current is not None:
            self._executors[key] = current
        self.plan_cache.clear()

    def _config_key(self) -> tuple[PlanParams, str]:
        # the CPU executor ignores the variant: one entry per params
        return self.params, (self.config.variant if self.backend == "gpu" else "")

    def executor(self, kind: str, transposed: bool = False, rows: str | None = None):
        """The executor of `kind` (over row set `rows`) for the current configuration (built
        once, kept in an LRU of `EXECUTOR_CACHE` configurations)."""
        cfg = self._config_key()
        per = self._executors.setdefault(cfg, {})
        self._executors.move_to_end(cfg)
        while len(self._executors) > self.EXECUTOR_CACHE:
            self._executors.popitem(last=False)  # its device arrays go with the last reference
        key = (kind, transposed, rows)
        if key not in per:
            plan = self.plan(kind, transposed, rows)
            per[key] = plan_executor(self.backend, plan, self.store, self.config.variant, kind,
                                     storage_dtype=self.config.storage_dtype)
        return per[key]

    def prepare(self) -> None:
        """Build, now, the executors of the current configuration for every plan this DistGraph
        has (plan arrays uploaded, kernels loaded), so the next `aggregate` pays none of it --
        the runtime tuner calls this right after a switch, outside the timed region."""
        for kind, transposed, rows in list(self._plans):
            self.executor(kind, transposed, rows)

    def symmetric(self, dim: int, dtype: torch.dtype = torch.float32) -> SymmetricArray:
        """The symmetric [rows_per_pe, dim] buffer for embeddings of width `dim` (allocated once)."""
        key = (dim, dtype)
        if key not in self._arrays:
            self._arrays[key] = self.store.allocate(self.rows_per_pe, dim, dtype)
        return self._arrays[key]

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The 16-bit torch dtype embeddings are stored in (config.storage_dtype), None for fp32
        (then the store holds x's own dtype, as before)."""
        dt = storage_torch_dtype(self.config.storage_dtype)
        return None if dt == torch.float32 else dt

    def gcn_factor(self) -> torch.Tensor:
        """float32 [n_local] on `self.device`: dinv = (deg_in + 1)^-1/2 of this rank's nodes, the
        row and the column factor of the gcn kind (W = diag(dinv) (A + I) diag(dinv)). Built
        once (from the gcn plan's self weights: mgg.runtime.weights.dinv_from_self_weight)."""
        f = self._gcn_factor
        if f is None:
            from ..runtime.weights import dinv_from_self_weight

            f = self._gcn_factor = torch.from_numpy(dinv_from_self_weight(self.plan("gcn").self_weight)).to(self.device)
        return f

    def takes_scaled_input(self, kind: str, rows: RowSet | str | None = None) -> bool:
        """Whether `aggregate(x, kind, factors=...)` with partial GcnFactors (over row set `rows`)
        runs natively, with no extra pass (the executors of kind and of its transpose take a
        scaled table on every rank: csr_rows and halo_csr, in float32 or bf16 storage); otherwise
        such calls still work, dividing by the factor around the plain call. The same answer on
        every rank; at P > 1 its first call for a configuration (GPU variant, plan knobs) is
        collective (an allreduce): every rank must ask alike."""
        if kind != "gcn":
            return False
        name = rows.name if isinstance(rows, RowSet) else rows
        return all(self._takes_scaled(kind, t, name) for t in (False, True))

    def _takes_scaled(self, kind: str, transposed: bool, rows: str | None) -> bool:
        """Whether the executor of (kind, transposed, rows) takes scaled input natively on every
        rank -- a rank's symmetric slice is read by the others, so all must hold cf * x or none
        -- cached per configuration (collective at P > 1 on a miss)."""
        key = (self._config_key(), kind, transposed, rows)
        agreed = self._scaled_native.get(key)
        if agreed is None:
            mine = bool(getattr(self.executor(kind, transposed, rows), "takes_scaled_input", False))
            agreed = self._scaled_native[key] = self.comm.allreduce_scalar(float(mine), "min") == 1.0
        return agreed

    def aggregate(self, x: torch.Tensor, kind: str, transposed: bool = False,
                  rows: RowSet | str | None = None, factors: GcnFactors = WHOLE) -> torch.Tensor:
        """out = W x (+ diag * x), or W^T x with `transposed`. Collective; no autograd.
        With `rows` (a registered RowSet or its name) W_S (or W_S^T): only the rows of the set
        are meaningful in the output (mgg.runtime.rowset).

        factors: the part of the gcn product W = diag(f) (A + I) diag(f), f = `gcn_factor()`,
        this call applies (mgg.graph.gcn_factors; both directions): `WHOLE` (default) the
        plain call of any kind; `SCALED_INPUT` x already holds f * x (the op that produced x
        folded the column factor in), out = diag(f) (A + I) x; `GcnFactors(row=False)` the
        output without the row factor, (A + I) diag(f) x -- the backward of a call on a scaled
        input. Partial factors need the gcn kind; they run natively (no extra pass) where
        `takes_scaled_input(kind)`, else by dividing by f around the plain call.

        With a 16-bit `config.storage_dtype`, x is rounded to it once, in the store, and every
        row the aggregation reads (local, remote, self term) is that rounded value; the sums
        are float32. The backward's transposed aggregation of gradient rows does the same.
        Where `takes_scaled_input(kind)`, the rounded value of a partial call is that of the
        scaled row: f * x (no column factor: x as given; else f * x, rounded once).

        Args:
            x: float32 [n_local, D] on `self.device`, the rows of this rank's nodes.
        Returns:
            float32 [n_local, D] (x's dtype).
        """
        if x.dim() != 2 or x.shape[0] != self.n_local:
            raise ValueError(f"aggregate: expected x of shape [{self.n_local}, D] on rank {self.rank}, "
                             f"got {tuple(x.shape)}")
        if not factors.whole and kind != "gcn":
            raise ValueError(f"aggregate: the factors {factors} are a part of the gcn kind's product "
                             f"diag(f) (A + I) diag(f), got kind {kind!r}")
        name = rows.name if isinstance(rows, RowSet) else rows
        ex = self.executor(kind, transposed, name)
        sym = self.symmetric(int(x.shape[1]), self.storage_dtype or x.dtype)
        with self.comm.guard(f"aggregate {kind}{' (transposed)' if transposed else ''}{f' rows {name}' if name else ''}"):
            if factors.whole:
                return ex(x, sym)
            return run_factored(ex, x, sym, factors, self._takes_scaled(kind, transposed, name), self.gcn_factor)

    def close(self) -> None:
        """Free symmetric buffers (collective)."""
        for arr in self._arrays.values():
            arr.free()
        self._arrays.clear()
        self._executors.clear()
        self.plan_cache.clear()
        self.store.close()

    def __enter__(self) -> "DistGraph":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
