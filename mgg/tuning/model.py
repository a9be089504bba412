"""MGG's performance/resource model (§6, Eq. 1-3), hardware limits, and the pruning rules.

For a configuration (ps, dist, wpb) and embedding width D:

    WPW          = 2 * ps * D * dist                      (Eq. 1, floats a warp aggregates)
    SMEM         = the variant's dynamic shared memory per block (mgg.kernels.variants: Eq. 1
                   ps*wpb*IntS + 2*wpb*Dp*FloatS for `paper`, wpb*ps*Dp*FloatS for the staged
                   pipelined kernels, 0 for ptr/halo), Dp = padded_dim(D)
    numWarps     = ceil(max(#local, #remote partitions) / dist)          (Eq. 2)
    numBlocks    = ceil(numWarps / wpb),  blocksPerSM = numBlocks / numSMs (Eq. 3)

The partition counts depend on ps (and ps_inter); `Workload` holds the row lengths a plan cuts,
so the model predicts them for any ps without re-cutting a plan.

Nothing here hard-codes a GPU: `DeviceLimits.from_device()` reads the limits from the device
(torch, else cupy), `DeviceLimits.cpu()` is the CPU path's stand-in.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ..kernels.variants import DEFAULT_VARIANT, get_variant, shared_memory_problem
from ..runtime.layout import padded_dim
from ..runtime.plan import PlanParams

__all__ = ["TuneConfig", "DeviceLimits", "Workload", "Estimate", "PruneRules", "padded_dim",
           "smem_bytes_for", "estimate", "feasible", "check"]

WARP = 32


@dataclass(frozen=True)
class TuneConfig:
    """One point of the search space: the plan knobs plus the kernel variant.

    Hashable (the search's lookup table is keyed by it). `ps_inter` None means "same as ps".
    """

    ps: int
    dist: int
    wpb: int
    variant: str = DEFAULT_VARIANT
    ps_inter: int | None = None

    def params(self) -> PlanParams:
        """The PlanParams of this configuration (validates the ranges)."""
        return PlanParams(int(self.ps), int(self.dist), int(self.wpb), self.ps_inter)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TuneConfig":
        pi = d.get("ps_inter")
        return cls(int(d["ps"]), int(d["dist"]), int(d["wpb"]), str(d.get("variant", DEFAULT_VARIANT)),
                   None if pi is None else int(pi))

    def sort_key(self) -> tuple:
        """Total order for ties: smaller knobs first, ps_inter None (= ps) before a value."""
        return (self.ps, self.dist, self.wpb, self.variant,
                -1 if self.ps_inter is None else self.ps_inter)

    def label(self) -> str:
        s = f"ps={self.ps} dist={self.dist} wpb={self.wpb}"
        if self.ps_inter is not None:
            s += f" ps_inter={self.ps_inter}"
        return f"{s} {self.variant}"


@dataclass(frozen=True)
class DeviceLimits:
    """The hardware constraints of Eq. 1-3 (the paper's constraints 1 and 2) for one device.

    Attributes:
        num_sms: streaming multiprocessors (CPU: cores).
        smem_per_block_optin: bytes of dynamic shared memory one block may opt in to.
        smem_per_sm: bytes of shared memory per SM (shared by the resident blocks).
        max_threads_per_block: 1024 on every CUDA GPU so far, read from the device anyway.
        max_threads_per_sm: resident threads per SM.
        name: device model name (part of the tuning-cache key).
    """

    num_sms: int
    smem_per_block_optin: int
    smem_per_sm: int
    max_threads_per_block: int
    max_threads_per_sm: int
    name: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceLimits":
        return cls(int(d["num_sms"]), int(d["smem_per_block_optin"]), int(d["smem_per_sm"]),
                   int(d["max_threads_per_block"]), int(d["max_threads_per_sm"]), str(d["name"]))

    @classmethod
    def cpu(cls) -> "DeviceLimits":
        """The CPU path: no shared-memory limit that matters; one 'SM' per core.

        The CPU executor only uses ps (partition cut); dist and wpb do not change its work.
        """
        big = 1 << 30
        return cls(num_sms=max(1, os.cpu_count() or 1), smem_per_block_optin=big, smem_per_sm=big,
                   max_threads_per_block=1024, max_threads_per_sm=2048, name="cpu")

    @classmethod
    def from_device(cls, device: Any = None) -> "DeviceLimits":
        """Read the limits of a CUDA device (index, torch.device or None = current).

        torch's device properties first (`multi_processor_count`, `shared_memory_per_block_optin`,
        `shared_memory_per_multiprocessor`, `max_threads_per_multi_processor`; torch exposes no
        max-threads-per-block), the rest through cupy's `Device.attributes`
        (cudaDeviceGetAttribute). Raises RuntimeError when a limit cannot be read.
        """
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("DeviceLimits.from_device: CUDA is not available")
        if device is None:
            idx = torch.cuda.current_device()
        elif isinstance(device, int):
            idx = device
        else:
            d = torch.device(device)
            idx = torch.cuda.current_device() if d.index is None else d.index
        p = torch.cuda.get_device_properties(idx)
        vals = {
            "num_sms": getattr(p, "multi_processor_count", None),
            "smem_per_block_optin": getattr(p, "shared_memory_per_block_optin", None),
            "smem_per_sm": getattr(p, "shared_memory_per_multiprocessor", None),
            "max_threads_per_block": getattr(p, "max_threads_per_block", None),
            "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", None),
        }
        missing = [k for k, v in vals.items() if not v]
        if missing:
            cupy_names = {"num_sms": "MultiProcessorCount",
                          "smem_per_block_optin": "MaxSharedMemoryPerBlockOptin",
                          "smem_per_sm": "MaxSharedMemoryPerMultiprocessor",
                          "max_threads_per_block": "MaxThreadsPerBlock",
                          "max_threads_per_sm": "MaxThreadsPerMultiProcessor"}
            try:
                import cupy

                attrs = cupy.cuda.Device(idx).attributes
                for k in missing:
                    vals[k] = attrs.get(cupy_names[k])
            except Exception as e:  # noqa: BLE001 - reported below with the missing names
                raise RuntimeError(f"DeviceLimits.from_device: torch lacks {missing} and cupy "
                                   f"could not read them: {e}") from e
        still = [k for k, v in vals.items() if not v]
        if still:
            raise RuntimeError(f"DeviceLimits.from_device: cannot read {still}")
        return cls(name=str(p.name), **{k: int(v) for k, v in vals.items()})

    @classmethod
    def detect(cls, device: Any = None) -> "DeviceLimits":
        """`from_device` when CUDA is present, else `cpu()`."""
        try:
            import torch
        except ImportError:
            return cls.cpu()
        cuda_dev = device is None or isinstance(device, int) or torch.device(device).type == "cuda"
        if cuda_dev and torch.cuda.is_available():
            return cls.from_device(device)
        return cls.cpu()


def _ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


class Workload:
    """The row lengths plans cut into partitions, to predict partition counts for any ps.

    Holds, per plan, histograms (length -> number of rows) of the local rows, the same-node
    remote rows and the other-node remote rows; the counts for a ps are sum(count * ceil(len/ps)).
    With several plans (forward + transposed, or several ranks) every count is the max over them:
    the slowest kernel bounds the iteration. A workload can also answer from a table (`table` /
    `from_table`), which is how ranks agree on one workload (allgather + `max_tables`).
    """

    def __init__(self, local_lengths: np.ndarray, remote_lengths: np.ndarray,
                 inter_lengths: np.ndarray | None = None):
        inter = np.zeros(0, np.int64) if inter_lengths is None else inter_lengths
        self._members = [tuple(self._histogram(a) for a in (local_lengths, remote_lengths, inter))]
        self._table: dict[tuple[int, int], tuple[int, int]] = {}
        self._table_inter = False

    @staticmethod
    def _histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = np.asarray(lengths, dtype=np.int64).reshape(-1)
        vals, counts = np.unique(a[a > 0], return_counts=True)
        return vals, counts

    @classmethod
    def from_plan(cls, plan: Any) -> "Workload":
        """From an AggregationPlan (its local/remote CSR and the same-node/other-node split)."""
        loc = np.diff(np.asarray(plan.local_indptr, np.int64))
        rip = np.asarray(plan.remote_indptr, np.int64)
        split = np.asarray(plan.remote_split, np.int64)
        return cls(loc, split - rip[:-1], rip[1:] - split)

    @classmethod
    def from_plans(cls, plans: Iterable[Any]) -> "Workload":
        """The max over several plans (e.g. the forward and transposed plans of each kind)."""
        ws = [cls.from_plan(p) for p in plans]
        if not ws:
            raise ValueError("Workload.from_plans: no plans")
        for o in ws[1:]:
            ws[0] = ws[0].max_with(o)
        return ws[0]

    def max_with(self, other: "Workload") -> "Workload":
        """A workload whose partition counts are the max of both, for every ps."""
        w = Workload(np.zeros(0), np.zeros(0))
        w._members = self._members + other._members
        w._table = {k: v for k, v in self._table.items()}
        for k, v in other._table.items():
            a = w._table.get(k, (0, 0))
            w._table[k] = (max(a[0], v[0]), max(a[1], v[1]))
        w._table_inter = self._table_inter or other._table_inter
        return w

    @property
    def has_inter(self) -> bool:
        """True when some remote neighbors live on other nodes (ps_inter then matters)."""
        return self._table_inter or any(m[2][0].size for m in self._members)

    @staticmethod
    def _parts(hist: tuple[np.ndarray, np.ndarray], ps: int) -> int:
        v, c = hist
        return int((c * ((v + ps - 1) // ps)).sum()) if v.size else 0

    def partitions(self, ps: int, ps_inter: int | None = None) -> tuple[int, int]:
        """(#local partitions, #remote partitions) of a plan cut with `ps` (and `ps_inter`)."""
        ps = int(ps)
        pi = ps if ps_inter is None else int(ps_inter)
        lo, re = self._table.get((ps, pi), (0, 0))
        for loc, rem, inter in self._members:
            lo = max(lo, self._parts(loc, ps))
            re = max(re, self._parts(rem, ps) + self._parts(inter, pi))
        return lo, re

    def table(self, ps_values: Sequence[int], ps_inter_values: Sequence[int | None] = (None,)
              ) -> dict[str, list[int]]:
        """{"ps,ps_inter": [local, remote]} for the given values: small, JSON-safe, and reducible
        across ranks by an elementwise max (`max_tables`, then `from_table`)."""
        out = {}
        for ps in ps_values:
            for pi in ps_inter_values:
                out[f"{ps},{'' if pi is None else pi}"] = list(self.partitions(ps, pi))
        return out

    @classmethod
    def from_table(cls, table: dict[str, Sequence[int]], has_inter: bool = False) -> "Workload":
        """A workload answering `partitions` from a `table` result (0 for values not in it)."""
        w = cls(np.zeros(0), np.zeros(0))
        w._table_inter = bool(has_inter)
        for k, (lo, re) in table.items():
            ps, pi = k.split(",")
            w._table[(int(ps), int(pi) if pi else int(ps))] = (int(lo), int(re))
        return w

    @staticmethod
    def max_tables(tables: Iterable[dict[str, Sequence[int]]]) -> dict[str, list[int]]:
        """Elementwise max of several `table` results (e.g. an allgather over the ranks)."""
        out: dict[str, list[int]] = {}
        for t in tables:
            for k, v in t.items():
                cur = out.get(k, [0, 0])
                out[k] = [max(cur[0], int(v[0])), max(cur[1], int(v[1]))]
        return out


def smem_bytes_for(ps: int, wpb: int, dim: int, variant: str = DEFAULT_VARIANT, dist: int = 1,
                   ps_inter: int | None = None) -> int:
    """Dynamic shared memory per block that `variant`'s launch asks for at embedding width `dim`
    (the registry's formula, mgg.kernels.variants, at padded_dim(dim) and the largest partition
    size max(ps, ps_inter)), assuming remote partitions."""
    ps_max = max(int(ps), int(ps_inter or ps))
    return get_variant(variant).smem_bytes(ps_max, dist, wpb, padded_dim(dim))


@dataclass(frozen=True)
class Estimate:
    """The model's numbers for one configuration (None where no workload was given)."""

    wpw: int                      # Eq. 1, floats per warp
    smem: int                     # Eq. 1, bytes per block (padded D)
    threads_per_block: int
    num_warps: int | None         # Eq. 2
    num_blocks: int | None        # Eq. 3
    blocks_per_sm: float | None   # Eq. 3
    resident_blocks_per_sm: int   # min over the smem and thread limits (occupancy)
    feasible: bool
    reason: str                   # why infeasible or pruned; "" when allowed

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PruneRules:
    """Conservative rules that skip configurations the model predicts to be worse.

    * `idle_sms` (R1): prune when numWarps < numSMs and ps or dist is above its smallest value:
      fewer warps than SMs leaves SMs without work, and a smaller ps/dist gives more warps.
    * `underfilled_blocks` (R2): prune when numBlocks < numSMs <= numWarps and wpb > 1: the same
      warps in smaller blocks would reach every SM.
    * `max_wpw` (R3): prune when WPW exceeds this many floats (None: off).
    Feasibility (smem per block <= opt-in limit, 32*wpb <= max threads per block, at least one
    block resident per SM) is not a rule: it always applies.
    """

    idle_sms: bool = True
    underfilled_blocks: bool = True
    max_wpw: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(cfg: TuneConfig, dim: int, limits: DeviceLimits, workload: Workload | None = None,
             rules: PruneRules | None = None, min_ps: int = 1, min_dist: int = 1) -> Estimate:
    """Evaluate Eq. 1-3 for `cfg` at embedding width `dim` and check feasibility/pruning."""
    wpw = 2 * cfg.ps * int(dim) * cfg.dist
    smem = smem_bytes_for(cfg.ps, cfg.wpb, dim, cfg.variant, cfg.dist, cfg.ps_inter)
    tpb = WARP * cfg.wpb
    res = min(limits.smem_per_sm // max(1, smem), limits.max_threads_per_sm // tpb)
    reason = shared_memory_problem(smem, limits.smem_per_block_optin)  # the launcher's rule
    if not reason and tpb > limits.max_threads_per_block:
        reason = f"{tpb} threads > {limits.max_threads_per_block} per block"
    elif not reason and res < 1:
        reason = "no block fits on an SM"
    feasible_ = not reason
    nw = nb = bps = None
    if workload is not None:
        lo, re = workload.partitions(cfg.ps, cfg.ps_inter)
        nw = _ceil_div(max(lo, re), cfg.dist)
        nb = _ceil_div(nw, cfg.wpb)
        bps = nb / limits.num_sms
    if feasible_ and rules is not None:
        if rules.max_wpw is not None and wpw > rules.max_wpw:
            reason = f"pruned: WPW {wpw} > {rules.max_wpw}"
        elif nw is not None and rules.idle_sms and nw < limits.num_sms and \
                (cfg.ps > min_ps or cfg.dist > min_dist):
            reason = f"pruned: {nw} warps < {limits.num_sms} SMs"
        elif nb is not None and rules.underfilled_blocks and cfg.wpb > 1 and \
                nb < limits.num_sms <= nw:
            reason = f"pruned: {nb} blocks < {limits.num_sms} SMs <= {nw} warps"
    return Estimate(wpw, smem, tpb, nw, nb, bps, int(res), feasible_, reason)


def feasible(cfg: TuneConfig, dim: int, limits: DeviceLimits) -> bool:
    """The hard constraints: smem per block fits the opt-in limit, 32*wpb <= max threads per
    block, one block fits on an SM. An infeasible configuration is never proposed or launched."""
    return estimate(cfg, dim, limits).feasible


def check(cfg: TuneConfig, dim: int, limits: DeviceLimits) -> None:
    """Raise ValueError when `cfg` is infeasible (for launchers that take a config from outside)."""
    e = estimate(cfg, dim, limits)
    if not e.feasible:
        raise ValueError(f"configuration {cfg.label()} is infeasible at D={dim} on {limits.name}: "
                         f"{e.reason}")
