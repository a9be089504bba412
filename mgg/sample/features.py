"""Where the input features of sampled nodes come from: the symmetric store or the host tier.

* `StoreFeatures`: the feature matrix is row-partitioned like the node embeddings of full-graph
  training: rank r publishes rows [bounds[r], bounds[r+1]) in its slice of a `SymmetricArray`
  (MPI RMA window on the CPU, NVSHMEM on the GPU). A gather is not collective. On the GPU it
  is one kernel launch in the ids' order (`_NvshmemArray.gather`: own rows from local memory,
  the others' over NVLink, several rows in flight a lane group), with the owners and rows worked
  out on the device and one small device-to-host read (the ids' range and the remote count); on
  the CPU it reads its own rows from `.local` and every other row with one-sided gets
  (`get_halo`: all PEs' gets in flight, one flush).
* `HostTierFeatures` (PyTorch-Direct's zero-copy tier): one copy of the whole matrix per *node*
  (machine) in an MPI shared-memory window, mapped by every rank of the node. The CPU gathers with
  `index_select`; on CUDA the pages are registered with `cudaHostRegister` (pinned, mapped) and a
  kernel (`mgg.kernels.sample_gpu.gather_host_rows_cuda`) reads the rows over PCIe/C2C directly
  into GPU memory, with no staging copy.
* `choose_feature_source`: the host tier when this rank's symmetric slice (rows_per_pe * F * 4
  bytes) would exceed the feature memory budget (`--feature-memory-budget`, 0 = unlimited).

Every source counts what it reads (`FetchStats`, cumulative in `.stats`, last call in `.last`).
"""
from __future__ import annotations

import abc
import re
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["FetchStats", "FeatureSource", "StoreFeatures", "HostTierFeatures", "TensorFeatures",
           "choose_feature_source", "make_feature_source", "parse_size", "FEATURE_TIERS"]

FEATURE_TIERS = ("store", "host")


@dataclass
class FetchStats:
    """Rows read from a feature source (bytes = rows * row_bytes).

    Attributes:
        rows: every row read (local slice + remote gets + host tier).
        rows_remote: rows read from other ranks' slices (one-sided gets).
        rows_host: rows read from the host tier.
        row_bytes: bytes of one row (F * 4 for float32).
    """

    rows: int = 0
    rows_remote: int = 0
    rows_host: int = 0
    row_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def bytes_remote(self) -> int:
        return self.rows_remote * self.row_bytes

    @property
    def bytes_host(self) -> int:
        return self.rows_host * self.row_bytes

    def add(self, other: "FetchStats") -> None:
        self.rows += other.rows
        self.rows_remote += other.rows_remote
        self.rows_host += other.rows_host


class FeatureSource(abc.ABC):
    """Input features of any node by global id.

    Attributes:
        num_nodes: N. dim: F. device: where `gather` returns rows. tier: "store" | "host" | "tensor".
        stats: FetchStats since construction. last: FetchStats of the last gather.
    """

    num_nodes: int
    dim: int
    device: torch.device
    tier: str = "abstract"

    def _init_stats(self) -> None:
        self.stats = FetchStats(row_bytes=4 * self.dim)
        self.last = FetchStats(row_bytes=4 * self.dim)

    def _ids(self, n_id, checked: bool = False) -> np.ndarray:
        ids = n_id.detach().cpu().numpy() if isinstance(n_id, torch.Tensor) else np.asarray(n_id)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"gather: n_id must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int64, copy=False)
        if ids.size and not checked:
            self._check_range(int(ids.min()), int(ids.max()))
        return ids

    def _device_ids(self, n_id, checked: bool = False) -> torch.Tensor:
        """n_id as int64 on self.device (a GPU), range-checked (unless `checked`) by one read of
        its (min, max) instead of a copy of every id to the host."""
        ids = self._on_device(n_id)
        if ids.numel() and not checked:
            self._check_range(*torch.stack([ids.min(), ids.max()]).tolist())
        return ids

    def _on_device(self, n_id) -> torch.Tensor:
        """n_id as int64 on self.device, its type checked; a host array is range-checked too (by
        `_ids`), a tensor is not (`_check_range` of its min and max)."""
        if not isinstance(n_id, torch.Tensor):
            return torch.from_numpy(self._ids(n_id)).to(self.device)
        if n_id.dim() != 1 or n_id.dtype.is_floating_point or n_id.dtype == torch.bool:
            raise TypeError(f"gather: n_id must be a 1-D integer array, got {n_id.dtype} {tuple(n_id.shape)}")
        return n_id.to(self.device, torch.int64)

    def _check_range(self, lo: int, hi: int) -> None:
        """IndexError unless every id lies in [0, num_nodes), given the smallest and the largest."""
        if lo < 0 or hi >= self.num_nodes:
            raise IndexError(f"gather: node id {lo if lo < 0 else hi} out of range [0, {self.num_nodes})")

    def _count(self, rows: int, remote: int = 0, host: int = 0) -> None:
        self.last = FetchStats(rows, remote, host, 4 * self.dim)
        self.stats.add(self.last)

    @abc.abstractmethod
    def gather(self, n_id, checked: bool = False) -> torch.Tensor:
        """float32 [U, F] rows of the global ids n_id (int64 [U]) on `self.device`.

        checked: the caller guarantees every id lies in [0, num_nodes) (the loader's own ids: its
        seeds were checked when it was built, sampled neighbors come from the CSR the load
        checked), so the range is not read (on a GPU: one synchronisation fewer). Otherwise an
        id out of range raises IndexError."""

    def table(self) -> torch.Tensor | None:
        """float32 [N, F] on `self.device` when this source holds every row in one table there
        (row i = node i), else None."""
        return None

    def rows(self, n_id, checked: bool = False):
        """The rows of n_id as `gather` returns them, or -- for ids the caller checked, from a
        source with one table (`table()`) -- as mgg.nn.IndexedRows(table, n_id): nothing copied,
        the first layer reads the table through the index. Counted as fetched either way."""
        table = self.table() if checked else None
        if table is None:
            return self.gather(n_id, checked)
        from ..nn.indexed_rows import IndexedRows

        ids = self._on_device(n_id)
        self._count(int(ids.numel()))
        return IndexedRows(table, ids)

    def close(self) -> None:
        """Free what the source holds (collective for the store and host tiers)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorFeatures(FeatureSource):
    """A plain in-memory [N, F] tensor (single process, tests)."""

    tier = "tensor"

    def __init__(self, x, device: torch.device | str = "cpu"):
        self.x = torch.as_tensor(np.asarray(x, dtype=np.float32) if not isinstance(x, torch.Tensor) else x)
        self.x = self.x.to(device=device, dtype=torch.float32)
        self.num_nodes, self.dim = int(self.x.shape[0]), int(self.x.shape[1])
        self.device = self.x.device
        self._init_stats()

    def table(self) -> torch.Tensor:
        return self.x

    def gather(self, n_id, checked: bool = False) -> torch.Tensor:
        if self.device.type == "cuda":
            ids = self._device_ids(n_id, checked)
            self._count(int(ids.numel()))
            return self.x[ids]
        ids = self._ids(n_id, checked)
        self._count(len(ids))
        return self.x[torch.from_numpy(ids).to(self.device)]


class StoreFeatures(FeatureSource):
    """Features row-partitioned over the ranks in a symmetric array; gathers by one-sided gets.

    Construction is collective (allocate, write my rows, publish); `gather` is not (the slices are
    published once and never written again); `close` is collective.

    Args:
        store: the SymmetricStore (`mgg.runtime.make_store` / `DistGraph.store`).
        bounds: int64 [P + 1] node ranges (`partition_ranges`); rank r owns [bounds[r], bounds[r+1]).
        x_local: float32 [bounds[r+1] - bounds[r], F], this rank's rows.
    """

    tier = "store"

    def __init__(self, store, bounds, x_local):
        self.store = store
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.rank, self.world_size = store.comm.rank, store.comm.size
        if len(self.bounds) != self.world_size + 1:
            raise ValueError(f"StoreFeatures: bounds has {len(self.bounds)} entries, expected {self.world_size + 1}")
        x_local = torch.as_tensor(np.ascontiguousarray(x_local, dtype=np.float32)
                                  if not isinstance(x_local, torch.Tensor) else x_local).float()
        self.lo, self.hi = int(self.bounds[self.rank]), int(self.bounds[self.rank + 1])
        if x_local.dim() != 2 or x_local.shape[0] != self.hi - self.lo:
            raise ValueError(f"StoreFeatures: rank {self.rank} owns {self.hi - self.lo} rows, got x_local of "
                             f"shape {tuple(x_local.shape)}")
        self.num_nodes = int(self.bounds[-1])
        self.dim = int(x_local.shape[1])
        self.rows_per_pe = max(1, int(np.diff(self.bounds).max()))
        self.array = store.allocate(self.rows_per_pe, self.dim, torch.float32)
        self.device = self.array.local.device
        self.array.write(x_local.to(self.device))
        self.array.publish()
        self._init_stats()

    @classmethod
    def from_global(cls, store, bounds, x) -> "StoreFeatures":
        """From the global matrix x (float32 [N, F], every rank passes the same): keeps my rows."""
        r = store.comm.rank
        b = np.asarray(bounds, dtype=np.int64)
        return cls(store, b, np.asarray(x)[int(b[r]): int(b[r + 1])])

    def table(self) -> torch.Tensor | None:
        """This rank's slice when it is the whole table (one rank), else None."""
        return self.array.local[: self.num_nodes] if self.world_size == 1 and self.array is not None else None

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """Owner rank of every global id (int64 [k]); empty ranges never own a node."""
        return np.searchsorted(self.bounds, ids, side="right") - 1

    def gather(self, n_id, checked: bool = False) -> torch.Tensor:
        if self.device.type == "cuda":
            return self._gather_on_device(n_id, checked)
        ids = self._ids(n_id, checked)
        owner = self.owner(ids)
        row = ids - self.bounds[owner]
        mine = owner == self.rank
        local = self.array.local
        out = torch.empty((len(ids), self.dim), dtype=torch.float32, device=self.device)
        dev = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        if mine.any():
            pos = np.flatnonzero(mine)
            out[dev(pos)] = local[dev(row[pos])]
        n_remote = int((~mine).sum())
        if n_remote:
            pos = np.flatnonzero(~mine)
            ow = owner[pos]
            order = np.argsort(ow, kind="stable")
            halo_ptr = np.zeros(self.world_size + 1, dtype=np.int64)
            np.cumsum(np.bincount(ow, minlength=self.world_size), out=halo_ptr[1:])
            fetched = self.array.get_halo(halo_ptr, row[pos][order])
            out[dev(pos[order])] = fetched.to(self.device)
        self._count(len(ids), remote=n_remote)
        return out

    def _gather_on_device(self, n_id, checked: bool = False) -> torch.Tensor:
        """`gather` on the GPU: owners and rows from the ids on the device, one launch; the ids'
        range and the remote count in one read (checked ids on one rank: a row gather of the
        local slice, nothing read)."""
        ids = self._on_device(n_id)
        k = int(ids.numel())
        if not k:
            self._count(0)
            return torch.empty((0, self.dim), dtype=torch.float32, device=self.device)
        if checked and self.world_size == 1:
            self._count(k)
            return self.array.local.index_select(0, ids)
        if getattr(self, "_bounds_t", None) is None:
            self._bounds_t = torch.from_numpy(np.asarray(self.bounds, np.int64)).to(self.device)
        b = self._bounds_t
        owner = (torch.searchsorted(b, ids, right=True) - 1).clamp_(0, self.world_size - 1)
        if checked:
            remote = int((owner != self.rank).sum())   # the remote-row counters' one read
        else:
            lo, hi, remote = torch.stack([ids.min(), ids.max(), (owner != self.rank).sum()]).tolist()
            self._check_range(lo, hi)
        rows = self.array.gather(owner.to(torch.int32), (ids - b[owner]).to(torch.int32))
        self._count(k, remote=int(remote))
        return rows if rows.is_contiguous() else rows.contiguous()

    def close(self) -> None:
        if self.array is not None:
            self.array.release()
            self.array.free()
            self.array = None


class HostTierFeatures(FeatureSource):
    """The zero-copy host tier: one copy of x per machine in MPI shared memory.

    Construction is collective over `comm` (each node's ranks copy their share of rows into the
    node's window); `gather` is local; `close` is collective. Without MPI (`comm` None or a
    single-process Communicator) the matrix is a plain numpy array.

    Args:
        x: float32 [N, F], the global matrix (every rank passes the same).
        comm: mgg Communicator (or None).
        device: where gathered rows go. CUDA: the window's pages are registered with
            cudaHostRegister and read by `mgg.kernels.sample_gpu.gather_host_rows_cuda`; tested in tests/sample/test_sample_gpu.py.
    """

    tier = "host"

    def __init__(self, x, comm=None, device: torch.device | str = "cpu"):
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"HostTierFeatures: x must be [N, F], got shape {x.shape}")
        self.num_nodes, self.dim = int(x.shape[0]), int(x.shape[1])
        self.device = torch.device(device)
        self._win = self._node_comm = None
        self._registered = False
        mpi_comm = getattr(comm, "comm", None)
        if mpi_comm is not None and mpi_comm.Get_size() > 1:
            self.host = self._shared_copy(x, mpi_comm)
        else:
            self.host = np.ascontiguousarray(x, dtype=np.float32)
        self.host_tensor = torch.from_numpy(self.host)
        if self.device.type == "cuda":
            self._register()
        self._init_stats()

    def _shared_copy(self, x: np.ndarray, mpi_comm) -> np.ndarray:
        from mpi4py import MPI

        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        self._node_comm = node
        nbytes = self.num_nodes * self.dim * 4
        self._win = MPI.Win.Allocate_shared(max(nbytes, 1) if node.Get_rank() == 0 else 0, 4, comm=node)
        buf, _ = self._win.Shared_query(0)
        arr = np.frombuffer(buf, dtype=np.float32, count=self.num_nodes * self.dim).reshape(self.num_nodes, self.dim)
        # every rank of the node copies its share of rows (in parallel), then all synchronise
        k, r = node.Get_size(), node.Get_rank()
        a, b = self.num_nodes * r // k, self.num_nodes * (r + 1) // k
        self._win.Lock_all(MPI.MODE_NOCHECK)
        arr[a:b] = x[a:b]
        self._win.Sync()
        node.Barrier()
        self._win.Sync()
        self._win.Unlock_all()
        return arr

    def _register(self) -> None:
        if self.host.nbytes == 0:
            return
        err = torch.cuda.cudart().cudaHostRegister(self.host.ctypes.data, self.host.nbytes, 0)
        if int(getattr(err, "value", err)) != 0:
            raise RuntimeError(f"HostTierFeatures: cudaHostRegister of {self.host.nbytes} bytes failed ({err})")
        self._registered = True

    def gather(self, n_id, checked: bool = False) -> torch.Tensor:
        if self.device.type == "cuda":
            from ..kernels.sample_gpu import gather_host_rows_cuda

            rows = self._device_ids(n_id, checked)
            self._count(int(rows.numel()), host=int(rows.numel()))
            return gather_host_rows_cuda(self.host_tensor, rows)
        ids = self._ids(n_id, checked)
        self._count(len(ids), host=len(ids))
        return self.host_tensor.index_select(0, torch.from_numpy(ids))

    def close(self) -> None:
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self.host.ctypes.data)
            self._registered = False
        self.host_tensor = self.host = None
        if self._win is not None:
            self._node_comm.Barrier()
            self._win.Free()
            self._node_comm.Free()
            self._win = self._node_comm = None


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes of a size like "8G", "512M", "64k", "1.5G", "1024", "2GiB", "0" (units are powers of
    1024; a trailing "B"/"iB" is allowed). Raises ValueError on anything else or a negative size."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return int(text)
    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)(?:i?[bB])?", s)
    if not m:
        raise ValueError(f"expected a size such as 8G, 512M, 64K or a number of bytes, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def choose_feature_source(num_nodes: int, feat_dim: int, budget_bytes: int, world_size: int = 1,
                          rows_per_pe: int | None = None, itemsize: int = 4) -> str:
    """"store" or "host": the host tier when this rank's symmetric slice would exceed the budget.

    Args:
        num_nodes, feat_dim: N, F.
        budget_bytes: per-rank (per-GPU) memory allowed for features; 0 = unlimited.
        world_size: P; with `rows_per_pe` None the slice is ceil(N / P) rows.
        rows_per_pe: the slice height of the partition (max range size), when known.
    """
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0 (0: unlimited), got {budget_bytes}")
    if rows_per_pe is None:
        rows_per_pe = -(-num_nodes // max(1, world_size))
    need = max(1, rows_per_pe) * feat_dim * itemsize
    return "host" if budget_bytes and need > budget_bytes else "store"


def make_feature_source(x, store, bounds, comm=None, budget_bytes: int = 0,
                        device: torch.device | str = "cpu", tier: str | None = None) -> FeatureSource:
    """The feature source for global features x (float32 [N, F]); collective.

    `tier` forces "store" or "host"; None chooses with `choose_feature_source` (the slice height
    is the partition's max range size).
    """
    x = np.asarray(x)
    b = np.asarray(bounds, dtype=np.int64)
    if tier is None:
        tier = choose_feature_source(int(x.shape[0]), int(x.shape[1]), budget_bytes,
                                     rows_per_pe=max(1, int(np.diff(b).max())))
    if tier not in FEATURE_TIERS:
        raise ValueError(f"tier must be one of {FEATURE_TIERS}, got {tier!r}")
    if tier == "host":
        return HostTierFeatures(x, comm, device)
    return StoreFeatures.from_global(store, b, x)
