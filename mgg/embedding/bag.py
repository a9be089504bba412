"""Sharded EmbeddingBag over the symmetric store.

All tables of a `MultiTableEmbeddingBag` live in ONE symmetric array (`TableLayout` gives every
table its row offset inside each PE's slice; tables narrower than the widest are zero-padded), so a
batch touching several tables is one exchange:

forward (SPMD, every rank its own batch; no collective). CPU store:
    keys = table_offset[t] + indices  ->  unique keys (each row fetched once per batch)
    own rows: read from my slice; others: one-sided gets from their owners (`get_halo`,
    all PEs' gets in flight before one flush)
    pooling: `torch.nn.functional.embedding_bag` over the fetched unique rows with remapped
    indices -- the same rows in the same bag order, so sum/mean/max, empty bags,
    per_sample_weights, include_last_offset and the max-mode gradient are torch's own.
GPU store (NVSHMEM): `mgg.embedding.gpu_lookup` -- inference is one fused check + route + read +
pool kernel per table with no host synchronisation on the way and no barrier; training gathers the
unique rows on the device (no host round trip) and pools them with torch as above. `checks`
("sync" / "deferred", mgg.embedding.device_input.CHECKS) says when bad ids raise.

backward: the gradient of the fetched rows (one per unique key) is kept on the module;
`reduce_gradients()` (collective) sends (row, grad) to the owners and sums duplicates there: on the
CPU store with one MPI Alltoallv, on the GPU store on the device (`mgg.embedding.grad_exchange`:
NVSHMEM all-to-alls, a deterministic sum at the owner; nothing crosses the host). The optimizers
in `mgg.embedding.optim` apply it to the owner's slice and publish.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..graph.backends import make_store
from ..runtime.comm import Communicator, world
from ..runtime.store import SymmetricStore
from .device_input import CHECKS
from .init import INITS, init_rows
from .lookup_counters import LookupCounters
from .sharding import TableLayout
from .table import TableConfig
from .validate import check_bag_input

__all__ = ["TableConfig", "SparseRowGrad", "MultiTableEmbeddingBag", "ShardedEmbeddingBag"]


@dataclass
class SparseRowGrad:
    """Summed gradient of the rows this rank owns: local rows (unique, ascending; int64 numpy on
    the CPU store, an int64 tensor on the GPU on the GPU store) and values [k, Dmax].

    fixed: the fixed-shape form (`reduce_gradients_fixed`): rows may hold -1 (no gradient; its
    values are to be ignored), the valid rows unique; the optimizers update under a mask."""

    rows: np.ndarray | torch.Tensor
    values: torch.Tensor
    fixed: bool = False

    def rows_numpy(self) -> np.ndarray:
        """The rows as an int64 numpy array (a copy from the GPU where they live there)."""
        return self.rows.cpu().numpy() if isinstance(self.rows, torch.Tensor) else self.rows


class _Fetch(torch.autograd.Function):
    """Fetched unique rows as an autograd node: backward hands their gradient to the module.

    keys: the rows' keys (numpy, CPU store; or an int64 tensor on the GPU where -1 marks an unused
    slot); owner, local: None (the rows are located here) or their owner PE and local row as
    tensors on the GPU (the GPU store's training path)."""

    @staticmethod
    def forward(ctx, anchor, module, keys, owner, local):  # noqa: ARG004 - anchor only connects the graph
        ctx.module, ctx.keys, ctx.owner, ctx.local = module, keys, owner, local
        if owner is None:
            return module._fetch(keys)
        from ..kernels.embedding_gpu import gather_rows

        return gather_rows(module.array, owner, local)

    @staticmethod
    def backward(ctx, grad):
        where = ctx.keys if ctx.owner is None else (ctx.owner, ctx.local)
        ctx.module._pending.append((where, grad.detach()))
        return None, None, None, None, None


class MultiTableEmbeddingBag(torch.nn.Module):
    """Several EmbeddingBag tables, row-sharded over the ranks in one symmetric array.

    Args:
        tables: `TableConfig`s (or dicts with their fields), every one with its shape.
        comm: the communicator (default `mgg.runtime.world()`).
        store: a `SymmetricStore` over `comm` (default `make_store(comm, backend)`).
        include_last_offset: as in torch.nn.EmbeddingBag (for every table).
        seed, init: seeded initialization (`mgg.embedding.init`); table t uses seed + t.
        weights: optional initial values per table instead of `init`: an array-like [N_t, D_t]
            (numpy memmaps are read only at the rows this rank owns) or a callable
            rows -> [len(rows), D_t]; None entries fall back to `init`.
        dtype: table dtype (float32 or float64).
        backend: "cpu" or "gpu" (only used when `store` is None).
        checks: GPU store: "sync" (bad input raises before the call returns; one synchronisation
            a call) or "deferred" (no synchronisation; `raise_input_errors()` raises), see
            mgg.embedding.device_input.CHECKS. The CPU store always checks before the lookup.
    """

    def __init__(self, tables: Sequence[TableConfig | dict], comm: Communicator | None = None,
                 store: SymmetricStore | None = None, *, include_last_offset: bool = False, seed: int = 0,
                 init: str = "normal", weights: Sequence[Any] | None = None, dtype: torch.dtype = torch.float32,
                 backend: str = "cpu", checks: str = "sync"):
        super().__init__()
        if checks not in CHECKS:
            raise ValueError(f"checks must be one of {CHECKS}, got {checks!r}")
        self.checks = checks
        #: GPU store training: pool with mgg.embedding.capturable_pool (no host read: capturable)
        #: instead of F.embedding_bag ("sum" and "mean" only; equal to float rounding)
        self.capturable_pooling = False
        self.tables = [t if isinstance(t, TableConfig) else TableConfig(**t) for t in tables]
        if not self.tables:
            raise ValueError("MultiTableEmbeddingBag needs at least one table")
        for t in self.tables:
            if not t.has_shape:
                raise ValueError(f"table {t.name!r}: num_embeddings/embedding_dim unknown (open its file first)")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        if weights is not None and len(weights) != len(self.tables):
            raise ValueError(f"weights: one entry per table ({len(self.tables)}), got {len(weights)}")
        self.comm = comm if comm is not None else world()
        self.store = store if store is not None else make_store(self.comm, backend)
        if self.store.comm.size != self.comm.size:
            raise ValueError("store and comm have different sizes")
        self.include_last_offset = bool(include_last_offset)
        self.dtype = dtype
        self.rank, self.world_size = self.comm.rank, self.comm.size
        self.layout = TableLayout(tuple(int(t.num_embeddings) for t in self.tables),
                                  tuple(t.sharding for t in self.tables), self.world_size)
        self.dims = np.array([int(t.embedding_dim) for t in self.tables], dtype=np.int64)
        self.dim = int(self.dims.max())
        # (keys, grad) on the CPU store; ((owner, local), grad) tensors on the GPU store
        self._pending: list[tuple[Any, torch.Tensor]] = []
        self._exchange = None  # the GPU store's DeviceGradExchange, made on first use
        self._dims_on: dict = {}  # device -> (tables' local bases, dims) for row_dims
        self._anchor = torch.zeros((), requires_grad=True)
        self.array = self.store.allocate(self.layout.rows_per_pe, self.dim, dtype)
        self._gpu = self.array.local.is_cuda  # NVSHMEM store: rows come through the CUDA kernels
        err = None
        try:
            with torch.no_grad():
                loc = self.array.local
                for t, cfg in enumerate(self.tables):
                    rows, lrows = self.layout.owned_rows(t, self.rank)
                    w = None if weights is None else weights[t]
                    if w is None:
                        vals = init_rows(rows, cfg.num_embeddings, cfg.embedding_dim, seed=seed + t, kind=init, dtype=dtype)
                    else:
                        vals = self._rows_from(w, rows, cfg)
                    loc[torch.from_numpy(lrows).to(loc.device), : cfg.embedding_dim] = vals.to(loc.device, dtype)
        except Exception as e:  # noqa: BLE001 - agreed below so that no rank hangs
            err = e
        try:
            self.comm.check(err)
        except BaseException:
            self.array.free()
            raise
        self.array.publish()
        self._lookup = None
        if self._gpu:
            from .gpu_lookup import GpuLookup

            try:
                self._lookup = GpuLookup(self)
            except BaseException:
                self.array.free()
                raise

    @staticmethod
    def _rows_from(w: Any, rows: np.ndarray, cfg: TableConfig) -> torch.Tensor:
        if callable(w) and not isinstance(w, (np.ndarray, torch.Tensor)):
            vals = w(rows)
        else:
            shape = tuple(w.shape)
            if shape != (cfg.num_embeddings, cfg.embedding_dim):
                raise ValueError(f"table {cfg.name!r}: weights of shape {shape}, expected "
                                 f"{(cfg.num_embeddings, cfg.embedding_dim)}")
            if isinstance(w, torch.Tensor):
                vals = w.detach().cpu()[torch.from_numpy(rows)]
            elif len(rows) and np.all(np.diff(rows) == 1):
                vals = np.asarray(w[int(rows[0]): int(rows[-1]) + 1])  # contiguous: one slice of a memmap
            else:
                vals = np.asarray(w[rows])
        vals = vals if isinstance(vals, torch.Tensor) else torch.from_numpy(np.array(vals))  # a copy: memmaps are read-only
        if tuple(vals.shape) != (len(rows), cfg.embedding_dim):
            raise ValueError(f"table {cfg.name!r}: weight rows of shape {tuple(vals.shape)}, expected {(len(rows), cfg.embedding_dim)}")
        if not vals.is_floating_point():
            raise TypeError(f"table {cfg.name!r}: weights must be floating point, got {vals.dtype}")
        bad = ~torch.isfinite(vals).all(dim=1)
        if bool(bad.any()):
            r = int(rows[int(torch.nonzero(bad)[0])])
            raise ValueError(f"table {cfg.name!r}: weights must be finite, row {r} holds NaN or infinity")
        return vals

    # -- lookup ---------------------------------------------------------------------------------
    @property
    def num_tables(self) -> int:
        return len(self.tables)

    def _fetch(self, keys: np.ndarray) -> torch.Tensor:
        """Rows of unique keys [U, Dmax]: mine read locally, the others by one-sided gets."""
        _, owner, local = self.layout.locate_keys(keys)
        if self._gpu:
            from ..kernels.embedding_gpu import gather_rows

            return gather_rows(self.array, owner, local)
        mine = owner == self.rank
        if mine.all():
            return self.array.local[torch.from_numpy(local)]
        out = torch.empty((len(keys), self.dim), dtype=self.dtype)
        if mine.any():
            out[torch.from_numpy(mine)] = self.array.local[torch.from_numpy(local[mine])]
        if not mine.all():
            pos = np.flatnonzero(~mine)
            ow = owner[pos]
            order = np.argsort(ow, kind="stable")
            ptr = np.concatenate([[0], np.cumsum(np.bincount(ow, minlength=self.world_size))]).astype(np.int64)
            fetched = self.array.get_halo(ptr, local[pos][order])
            out[torch.from_numpy(pos[order])] = fetched
        return out

    def read_rows(self, t: int, rows: np.ndarray) -> torch.Tensor:
        """Current values [len(rows), D_t] of rows of table t (one-sided; not collective)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.tables[t].num_embeddings):
            raise IndexError(f"read_rows: rows out of range [0, {self.tables[t].num_embeddings})")
        return self._fetch(self.layout.table_offset[t] + rows)[:, : int(self.dims[t])]

    def forward(self, indices: Sequence[Any], offsets: Sequence[Any] | None = None,
                per_sample_weights: Sequence[Any] | None = None) -> list[torch.Tensor | None]:
        """Pooled embeddings of every table ([B_t, D_t]; None where indices[t] is None)."""
        T = self.num_tables
        if len(indices) != T:
            raise ValueError(f"expected indices for {T} tables, got {len(indices)}")
        offsets = [None] * T if offsets is None else offsets
        psws = [None] * T if per_sample_weights is None else per_sample_weights
        if len(offsets) != T or len(psws) != T:
            raise ValueError(f"offsets and per_sample_weights need one entry per table ({T})")
        grad = torch.is_grad_enabled() and self.training
        if self._lookup is not None:
            if grad:
                return self._lookup.forward_train(indices, offsets, psws, self._fetch_slots)
            return self._lookup.forward_pooled(indices, offsets, psws)
        bags, keys = [], []
        for t, cfg in enumerate(self.tables):
            if indices[t] is None:
                bags.append(None)
                continue
            b = check_bag_input(indices[t], offsets[t], psws[t], num_embeddings=cfg.num_embeddings, mode=cfg.mode,
                                include_last_offset=self.include_last_offset, what=f"table {cfg.name or t}")
            bags.append(b)
            keys.append(b.indices.numpy() + self.layout.table_offset[t])
        allkeys = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        uniq, inv = np.unique(allkeys, return_inverse=True)
        inv = torch.from_numpy(inv.reshape(-1).astype(np.int64))
        if grad:
            rows = _Fetch.apply(self._anchor, self, uniq, None, None)
        else:
            rows = self._fetch(uniq)
        outs: list[torch.Tensor | None] = []
        pos = 0
        dev = rows.device
        for t, b in enumerate(bags):
            if b is None:
                outs.append(None)
                continue
            n = int(b.indices.numel())
            d = int(self.dims[t])
            w = rows if d == self.dim else rows[:, :d]
            psw = None if b.per_sample_weights is None else b.per_sample_weights.to(dev, w.dtype)
            outs.append(F.embedding_bag(inv[pos: pos + n].to(dev), w, b.offsets.to(dev), mode=self.tables[t].mode,
                                        per_sample_weights=psw, include_last_offset=True))
            pos += n
        return outs

    def _fetch_slots(self, keys: torch.Tensor, owner: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """GPU training path: rows of (owner, local) [n, Dmax] as an autograd node (owner -1: zeros)."""
        return _Fetch.apply(self._anchor, self, keys, owner, local)

    # -- GPU lookup: checks and counts ----------------------------------------------------------
    @property
    def counters(self) -> LookupCounters:
        """Launches, synchronisations, copies and barriers of the GPU forward calls so far (the
        CPU store's calls are not counted: all zeros)."""
        return self._lookup.counters if self._lookup is not None else LookupCounters()

    def capture_refs(self) -> list[torch.Tensor]:
        """Device tensors a captured GPU training call reads besides its inputs and the module's own
        (the lookup's cached per-shape vectors, which a later call may evict): a CUDA graph's
        owner keeps them alive as long as the graph."""
        return [] if self._lookup is None else list(self._lookup.route_cache.tensors.values())

    def raise_input_errors(self) -> None:
        """With checks="deferred": raise the first bad-input error recorded by the GPU lookups
        since the last check, and clear it (one synchronisation). Nothing to do on the CPU store."""
        if self._lookup is not None:
            self._lookup.raise_input_errors()

    def rows_read(self) -> tuple[int, int, int]:
        """GPU store: (rows read, rows read from other PEs, bytes read from other PEs) by the
        inference lookups since the module was made (one synchronisation); zeros on the CPU store."""
        return self._lookup.rows_read() if self._lookup is not None else (0, 0, 0)

    # -- gradients ------------------------------------------------------------------------------
    def clear_gradients(self) -> None:
        self._pending.clear()

    def input_error_flag(self) -> torch.Tensor:
        """0-d float32, 1 when a GPU lookup since the last check recorded bad input, else 0 (no host
        read; the CPU store raises in the call instead: always 0)."""
        return self._lookup.error_flag() if self._lookup is not None else torch.zeros(())

    def scale_gradients_(self, keep: torch.Tensor) -> None:
        """Multiply every pending row gradient by `keep` (0-d; 0 drops the step's update)."""
        for _, g in self._pending:
            g.mul_(keep)

    def reduce_gradients(self) -> SparseRowGrad:
        """Collective: send every pending (key, grad) to its owner; returns my rows' summed gradient."""
        if self._gpu:
            return self._reduce_on_device()
        if self._pending:
            keys = np.concatenate([k.cpu().numpy() if isinstance(k, torch.Tensor) else k for k, _ in self._pending])
            grads = torch.cat([g.to("cpu") for _, g in self._pending])
            if keys.size and keys.min() < 0:  # unused slots of the GPU training path
                keep = keys >= 0
                keys, grads = keys[keep], grads[torch.from_numpy(keep)]
        else:
            keys, grads = np.zeros(0, dtype=np.int64), torch.zeros((0, self.dim), dtype=self.dtype)
        self._pending.clear()
        uk, inv = np.unique(keys, return_inverse=True)  # coalesce before sending
        g = torch.zeros((len(uk), self.dim), dtype=self.dtype).index_add_(0, torch.from_numpy(inv.reshape(-1)), grads.to(self.dtype))
        _, owner, local = self.layout.locate_keys(uk)
        if self.world_size > 1:
            from .grad_host import exchange_on_host

            return SparseRowGrad(*exchange_on_host(self.comm, owner, local, g, self.world_size))
        order = np.argsort(local, kind="stable")
        return SparseRowGrad(local[order], g[torch.from_numpy(order)])

    def _reduce_on_device(self) -> SparseRowGrad:
        """The GPU store's reduce_gradients: slots (owner -1: unused) to their owners on the device."""
        from .grad_exchange import DeviceGradExchange, sum_received

        dev = self.array.local.device
        if self._pending:
            owner = torch.cat([w[0].to(torch.int64) for w, _ in self._pending])
            local = torch.cat([w[1].to(torch.int64) for w, _ in self._pending])
            grads = torch.cat([g for _, g in self._pending]).to(self.dtype)
        else:
            owner = torch.zeros(0, dtype=torch.int64, device=dev)
            local = torch.zeros(0, dtype=torch.int64, device=dev)
            grads = torch.zeros((0, self.dim), dtype=self.dtype, device=dev)
        self._pending.clear()
        if self.world_size == 1:
            rows, vals = sum_received(torch.where(owner >= 0, local, torch.full_like(local, -1)), grads)
            return SparseRowGrad(rows, vals)
        if self._exchange is None:
            self._exchange = DeviceGradExchange(self.store, self.world_size, self.dim, self.dtype)
        rows, vals = self._exchange.exchange(owner, local, grads)
        return SparseRowGrad(rows, vals)

    def reserve_fixed_gradients(self, slots: int) -> None:
        """Collective, outside any CUDA graph: make `reduce_gradients_fixed` ready for forwards of
        up to `slots` gradient slots (GPU store: n + 1 for a call of n ids over all tables)."""
        if not self._gpu:
            raise RuntimeError("fixed-shape gradients need the GPU store")
        if self.world_size > 1:
            from .grad_exchange import DeviceGradExchange

            if self._exchange is None:
                self._exchange = DeviceGradExchange(self.store, self.world_size, self.dim, self.dtype)
            self._exchange.reserve_fixed(slots)

    def reduce_gradients_fixed(self) -> SparseRowGrad:
        """Collective, no host read (capturable), GPU store: the gradient of ONE forward (its slots
        are unique keys) at the owners, of a fixed shape: rows int64 [m] with -1 where nothing
        (the optimizers' masked update), values [m, Dmax]. At P = 1 the slots are the rows."""
        if not self._gpu or len(self._pending) != 1:
            raise RuntimeError(f"fixed-shape gradients need one pending GPU forward, got {len(self._pending)}")
        (owner, local), grads = self._pending.pop()
        grads = grads.to(self.dtype)
        if self.world_size == 1:
            local = local.to(torch.int64)
            return SparseRowGrad(torch.where(owner >= 0, local, torch.full_like(local, -1)), grads, fixed=True)
        rows, vals = self._exchange.exchange_fixed(owner, local, grads)
        return SparseRowGrad(rows, vals, fixed=True)

    def row_dims(self, local_rows: torch.Tensor) -> torch.Tensor:
        """Embedding dim of the table of each of my local rows (int64 [k] on local_rows' device: the
        table from the tables' local bases; the small vectors are copied to the device once, so
        a CUDA graph capture can call it)."""
        dev = local_rows.device
        if (self.dims == self.dims[0]).all():
            return torch.full(local_rows.shape, int(self.dims[0]), dtype=torch.int64, device=dev)
        if dev not in self._dims_on:
            self._dims_on[dev] = (torch.from_numpy(self.layout.base).to(dev), torch.from_numpy(self.dims).to(dev))
        base, dims = self._dims_on[dev]
        t = torch.searchsorted(base, local_rows, right=True) - 1
        return dims[t]

    # -- whole tables (collective; tests, snapshots) ----------------------------------------------
    def gather_table(self, t: int) -> torch.Tensor:
        """Collective: the full table t [N_t, D_t] on every rank."""
        rows, lrows = self.layout.owned_rows(t, self.rank)
        mine = self.array.local[torch.from_numpy(lrows).to(self.array.local.device), : int(self.dims[t])].cpu()
        parts = self.comm.allgather((rows, mine.numpy()))
        out = torch.empty((self.tables[t].num_embeddings, int(self.dims[t])), dtype=self.dtype)
        for r, v in parts:
            out[torch.from_numpy(r)] = torch.from_numpy(v)
        return out

    def gather_gradient(self, grad: SparseRowGrad) -> list[torch.Tensor]:
        """Collective: dense per-table gradients [N_t, D_t] from every rank's `SparseRowGrad`."""
        parts = self.comm.allgather((grad.rows_numpy(), grad.values.cpu().numpy()))
        out = [torch.zeros((c.num_embeddings, c.embedding_dim), dtype=self.dtype) for c in self.tables]
        for pe, (rows, vals) in enumerate(parts):
            tab, grow = self.layout.keys_of_local(pe, rows)
            for t in range(self.num_tables):
                m = tab == t
                if m.any():
                    out[t][torch.from_numpy(grow[m])] = torch.from_numpy(vals[m, : int(self.dims[t])])
        return out

    def free(self) -> None:
        """Collective: release the symmetric array (and the gradient exchange's buffers)."""
        if self._exchange is not None:
            self._exchange.free()
            self._exchange = None
        if self.array is not None:
            self.array.free()
            self.array = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def extra_repr(self) -> str:
        return f"tables={len(self.tables)}, world={self.world_size}, rows_per_pe={self.layout.rows_per_pe}, dim={self.dim}"


class ShardedEmbeddingBag(MultiTableEmbeddingBag):
    """`torch.nn.EmbeddingBag` with the table row-sharded over the ranks (one table).

    `forward(indices, offsets=None, per_sample_weights=None)` means exactly what it means to
    torch.nn.EmbeddingBag(num_embeddings, embedding_dim, mode=mode,
    include_last_offset=include_last_offset); every rank looks up its own batch.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "mean", sharding: str = "range",
                 comm: Communicator | None = None, store: SymmetricStore | None = None, *,
                 include_last_offset: bool = False, seed: int = 0, init: str = "normal",
                 weight: Any = None, dtype: torch.dtype = torch.float32, backend: str = "cpu",
                 checks: str = "sync"):
        super().__init__([TableConfig(num_embeddings, embedding_dim, mode, sharding)], comm, store,
                         include_last_offset=include_last_offset, seed=seed, init=init,
                         weights=None if weight is None else [weight], dtype=dtype, backend=backend,
                         checks=checks)
        self.num_embeddings, self.embedding_dim, self.mode, self.sharding = num_embeddings, embedding_dim, mode, sharding

    def forward(self, indices, offsets=None, per_sample_weights=None) -> torch.Tensor:  # type: ignore[override]
        return super().forward([indices], [offsets], [per_sample_weights])[0]

    def weight(self) -> torch.Tensor:
        """Collective: the full table."""
        return self.gather_table(0)
