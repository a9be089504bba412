"""Fixtures of the bench tests."""
import pytest


@pytest.fixture
def gloo():
    """The world communicator with torch.distributed's gloo group over it (bench/dlrm.py's
    all-to-all design runs on it); the group is ended after the test."""
    import torch.distributed as tdist

    from bench import dlrm as bench_dlrm
    from mgg.runtime import world

    comm = world()
    bench_dlrm.init_torch_distributed(comm, "cpu")
    yield comm
    tdist.destroy_process_group()
