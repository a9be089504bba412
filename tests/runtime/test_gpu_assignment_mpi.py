"""The GPU-assignment verdict is collective: a problem found on one rank (or two ranks on one
GPU) gives every rank the same message, so all exit together instead of some hanging in NVSHMEM.
Fabricated probes stand in for GPUs (CPU CI). Run under mpirun -np 2|3 --with-mpi."""
import pytest

from mgg.runtime import world
from mgg.runtime.gpu_assignment import GpuProbe, check_gpu_assignment

pytestmark = pytest.mark.mpi(min_size=2)


def test_one_rank_without_a_gpu_fails_every_rank():
    comm = world()
    last = comm.size - 1

    def probe(rank, local_rank):
        why = "no CUDA GPU is visible" if rank == last else ""
        return GpuProbe(rank, "h", 1, None if why else 0, None if why else f"u{rank}", why)
    msg = check_gpu_assignment(comm, probe)
    assert msg.startswith(f"rank {last} on h: no CUDA GPU is visible")
    assert comm.allgather(msg) == [msg] * comm.size


def test_shared_gpu_found_on_every_rank():
    comm = world()
    msg = check_gpu_assignment(comm, lambda rank, lr: GpuProbe(rank, "h", 1, 0, "one-gpu"))
    assert "on h would share one GPU" in msg and comm.allgather(msg) == [msg] * comm.size
    assert check_gpu_assignment(comm, lambda rank, lr: GpuProbe(rank, "h", comm.size, rank, f"g{rank}")) == ""
