"""One rank, one GPU (mgg.runtime.gpu_assignment): the verdict on fabricated probes, and what
mgg.doctor reports from them. The collective agreement runs under mpirun in
tests/runtime/test_gpu_assignment_mpi.py."""
import dataclasses

import pytest

from mgg.doctor import analyse
from mgg.runtime.gpu_assignment import GpuProbe, assignment_problem, device_index


def P(rank, host="a", uuid=None, count=8, why=""):
    return GpuProbe(rank, host, count, None if why else rank % count, uuid or f"GPU-{host}-{rank}", why)


def test_device_index_and_no_device():
    assert [device_index(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="no CUDA device"):
        device_index(0, 0)


def test_one_gpu_per_rank_is_fine_however_they_are_seen():
    assert assignment_problem([P(r) for r in range(8)]) == ""
    # per-rank CUDA_VISIBLE_DEVICES (Slurm binding): each rank sees one GPU, all different
    assert assignment_problem([P(r, count=1, uuid=f"u{r}") for r in range(4)]) == ""
    # the same device index on two hosts is two GPUs
    assert assignment_problem([P(0, "a", "x"), P(1, "b", "y")]) == ""


def test_more_ranks_than_gpus_is_named():
    probes = [P(r, uuid=f"u{r % 2}", count=2) for r in range(3)]  # 3 ranks, 2 GPUs: ranks 0 and 2 share
    msg = assignment_problem(probes)
    assert "ranks 0, 2 on a would share one GPU" in msg and "3 ranks on this host, 2 distinct GPUs" in msg
    assert "CUDA_VISIBLE_DEVICES" in msg


def test_two_ranks_given_the_same_gpu():
    # a bad binding: both ranks see one GPU, the same physical one
    msg = assignment_problem([P(0, uuid="same", count=1), P(1, uuid="same", count=1), P(2, "b", "other", 1)])
    assert msg.startswith("ranks 0, 1 on a would share one GPU")


def test_a_rank_without_a_gpu_is_named_first():
    msg = assignment_problem([P(1), P(0, why="no CUDA GPU is visible"), P(2, uuid="GPU-a-1")])
    assert msg.startswith("rank 0 on a: no CUDA GPU is visible")


def _facts(rank, host, probe, gpus=2):
    return {"rank": rank, "host": host, "problems": [], "mgg": "0", "python": "3", "torch": "2",
            "torch_cuda": "13", "gpus": ["H200"] * gpus, "links": "NVLink", "links_source": "test",
            "nvshmem": {"importable": True, "version": "3.4.5", "dist": "d", "error": None},
            "env": {"NVSHMEM_DISABLE_NVLS": "1"}, "mpi_library": "Open MPI", "mpi_standard": "3.1",
            "mpi4py": "4", "launch_size": None, "gpu_probe": dataclasses.asdict(probe)}


def test_doctor_compares_physical_gpus():
    ok = [(True, "ok")] * 2
    # each rank sees one GPU of its own: not "2 ranks on 1 GPUs"
    fs = [_facts(r, "a", P(r, uuid=f"u{r}", count=1), gpus=1) for r in range(2)]
    _, problems, _ = analyse(fs, [0, 0], ok, "gpu", 2)
    assert problems == []
    fs = [_facts(r, "a", P(r, uuid="same", count=1), gpus=1) for r in range(2)]
    _, problems, _ = analyse(fs, [0, 0], ok, "gpu", 2)
    assert any("ranks 0, 1 on a would share one GPU" in p for p in problems)


def test_unknown_identities_are_not_compared():
    """A torch without device UUIDs or PCI ids gives uuid None: no verdict from it, never a false alarm."""
    from types import SimpleNamespace

    from mgg.runtime.gpu_assignment import _physical_id

    assert assignment_problem([GpuProbe(r, "a", 1, 0, None) for r in range(3)]) == ""
    assert _physical_id(SimpleNamespace(uuid="GPU-1")) == "GPU-1"
    assert _physical_id(SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1b, pci_device_id=0)) == "pci-0:1b:0"
    assert _physical_id(SimpleNamespace()) is None
