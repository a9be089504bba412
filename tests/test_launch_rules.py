"""The one grid rule of the grid-stride kernels (mgg.kernels.launch.blocks_for), without a GPU:
the SM count is taken from the per-GPU cache."""
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
