"""One rank, one GPU: which device each rank takes, and the checks every rank agrees on.

A rank uses device ``local_rank % device_count`` of the GPUs it can see (`device_index`). That is
right when each rank sees all the node's GPUs (mpirun) and when each sees only its own
(``CUDA_VISIBLE_DEVICES`` per rank, as Slurm's GPU binding does). It is wrong when a node runs
more ranks than it has GPUs, or when two ranks are handed the same GPU: two ranks then share one
GPU, and NVSHMEM fails or hangs. The test therefore compares the physical devices (UUIDs) that the
ranks of each host will use, not GPU counts.

`check_gpu_assignment(comm)` is collective. Every rank probes its own device, the probes are
all-gathered, and every rank returns the same verdict: "" or one line that names the ranks, the
host and the way out.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Callable

__all__ = ["GpuProbe", "device_index", "probe_local_gpu", "assignment_problem", "check_gpu_assignment"]


@dataclass(frozen=True)
class GpuProbe:
    """What one rank found: `index` and `uuid` of the device it will use (None without one),
    `count` of devices it sees, `why` it cannot use one ("" when it can)."""

    rank: int
    host: str
    count: int
    index: int | None = None
    uuid: str | None = None
    why: str = ""


def device_index(local_rank: int, device_count: int) -> int:
    """The device a rank uses among those it sees: ``local_rank % device_count``."""
    if device_count < 1:
        raise ValueError("no CUDA device is visible")
    return int(local_rank) % int(device_count)


def _physical_id(props) -> str | None:
    """The device's UUID, else its PCI domain:bus:device, else None (not comparable: older torch)."""
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return str(uuid)
    pci = tuple(getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    return None if None in pci else "pci-%x:%x:%x" % pci


def probe_local_gpu(rank: int, local_rank: int) -> GpuProbe:
    """This rank's GpuProbe (imports torch; never raises)."""
    host = socket.gethostname()
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            return GpuProbe(rank, host, 0, why="no CUDA GPU is visible")
        i = device_index(local_rank, n)
        return GpuProbe(rank, host, n, i, _physical_id(torch.cuda.get_device_properties(i)))
    except Exception as e:  # noqa: BLE001 - a broken driver is a finding, not a crash
        return GpuProbe(rank, host, 0, why=f"CUDA cannot be queried ({type(e).__name__}: {e})")


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(rs))


def assignment_problem(probes: list[GpuProbe]) -> str:
    """The first problem of a job's probes (one per rank, any order), or "" when every rank has
    its own GPU. Pure: tested with fabricated probes."""
    probes = sorted(probes, key=lambda p: p.rank)
    for p in probes:
        if p.why:
            return f"rank {p.rank} on {p.host}: {p.why}; every rank of the GPU backend needs its own GPU"
    by_host: dict[str, list[GpuProbe]] = {}
    for p in probes:
        by_host.setdefault(p.host, []).append(p)
    for host, ps in by_host.items():
        users: dict[str, list[int]] = {}
        for p in ps:
            if p.uuid is not None:  # a GPU of unknown identity cannot be compared (no false alarm)
                users.setdefault(p.uuid, []).append(p.rank)
        shared = [rs for rs in users.values() if len(rs) > 1]
        if shared:
            rs = shared[0]
            seen = max(p.count for p in ps)
            return (f"{_ranks(rs)} on {host} would share one GPU ({len(ps)} ranks on this host, "
                    f"{len(users)} distinct GPUs among them, each rank sees {seen}): start at most one rank "
                    f"per GPU (mpirun -np <= GPUs per node), or give each rank its own CUDA_VISIBLE_DEVICES")
    return ""


def check_gpu_assignment(comm, probe: Callable[[int, int], GpuProbe] = probe_local_gpu) -> str:
    """Collective: every rank probes its GPU (`probe(rank, local_rank)`), the probes are
    all-gathered, and every rank returns the same `assignment_problem`."""
    mine = probe(comm.rank, comm.local_rank)
    return assignment_problem(list(comm.allgather(mine)))
