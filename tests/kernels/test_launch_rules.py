"""The one grid rule of the grid-stride kernels (mgg.kernels.launch.blocks_for), without a GPU:
the SM count is taken from the per-GPU cache; and float4_rows, the launchers' one way to rows a
kernel reads as float4s."""
import pytest

from mgg.kernels import launch


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setitem(launch._SMS, 5, 132)  # GPU 5 "has" 132 SMs
    return 5


def test_blocks_cover_the_work_up_to_the_cap(fake_gpu):
    assert launch.blocks_for(1000, 256, fake_gpu, 8) == 4          # ceil(1000 / 256)
    assert launch.blocks_for(256, 256, fake_gpu, 8) == 1
    assert launch.blocks_for(257, 256, fake_gpu, 8) == 2
    assert launch.blocks_for(10 ** 12, 256, fake_gpu, 8) == 132 * 8  # capped at per_sm a SM
    assert launch.blocks_for(10 ** 12, 256, fake_gpu, 1) == 132


def test_no_work_still_launches_one_block(fake_gpu):
    assert launch.blocks_for(0, 256, fake_gpu, 8) == 1


def test_cuda_index_of_an_int_is_itself():
    assert launch.cuda_index(3) == 3


def test_float4_rows_copies_only_what_a_float4_read_cannot_take():
    import torch

    from mgg.kernels.launch import float4_rows

    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    assert float4_rows(base) is base  # contiguous, 16-byte aligned: as is
    odd = base.flatten()[1:57].reshape(7, 8)  # starts 4 bytes in: misaligned
    out = float4_rows(odd)
    assert out.data_ptr() % 16 == 0 and out.is_contiguous() and torch.equal(out, odd)
    cols = base[:, ::2]  # not contiguous
    out = float4_rows(cols)
    assert out.is_contiguous() and out.data_ptr() % 16 == 0 and torch.equal(out, cols)


def test_launch_cache_keys_functions_by_the_module_object():
    """A module swapped in after another was freed gets its own functions: the cache's key holds
    the module (an id() key let a new module reuse a freed one's id and get its functions)."""
    from mgg.kernels.streams import LaunchCache

    class Module:
        def __init__(self, tag):
            self.tag = tag

        def get_function(self, name):
            return (self.tag, name)

    cache = LaunchCache(device=0)
    first = Module("first")
    assert cache.function(first, "k") == ("first", "k")
    del first
    for i in range(50):
        assert cache.function(Module(i), "k") == (i, "k")
