"""The counter-based hash RNG of the generators (mgg.data.hashrng) against a numpy uint32
implementation of lowbias32, its distributions, the guide-table search against torch.searchsorted,
and generator output equal on CPU and CUDA (GPU test skipped without one)."""
import numpy as np
import pytest
import torch

from mgg.data.generators import _GuideSearch, powerlaw, preset
from mgg.data.hashrng import approx_normal, below24, mix32, stream_keys, uniform53, words


def _lowbias32_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def test_mix32_is_lowbias32():
    x = np.concatenate([np.arange(1000), np.random.default_rng(0).integers(0, 2 ** 32, 100000),
                        [2 ** 32 - 1, 2 ** 31, 2 ** 31 - 1]]).astype(np.int64)
    got = mix32(torch.from_numpy(x)).numpy()
    assert got.min() >= 0 and got.max() < 2 ** 32
    assert np.array_equal(got.astype(np.uint32), _lowbias32_np(x))
    keys = stream_keys(5, 1, 3)
    a, b, c = words(torch.from_numpy(x), keys, 3)
    w0 = _lowbias32_np(x ^ keys[0])
    assert np.array_equal(a.numpy(), w0) and np.array_equal(b.numpy(), _lowbias32_np(w0 ^ keys[1]))


def test_distributions():
    e = torch.arange(2_000_000)
    a, b, m = words(e, stream_keys(1, 2, 3), 3)
    u = uniform53(a, b).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 2e-3 and abs(u.var() - 1 / 12) < 1e-3
    assert np.histogram(u, bins=20, range=(0, 1))[0].min() > 0.97 * len(u) / 20
    assert abs(below24(m, 0.8).float().mean().item() - 0.8) < 2e-3
    z = approx_normal(a, b).numpy()
    assert z.dtype == np.float32 and abs(z.mean()) < 5e-3 and abs(z.var() - 1) < 5e-3
    assert np.abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5e-3  # consecutive counters independent


def test_guide_search_is_exact():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 1000, 70000):
        cw = np.cumsum(rng.lognormal(0, 2.0, size=n))
        r = np.concatenate([rng.random(200000) * cw[-1], cw, np.nextafter(cw, 0), np.nextafter(cw, np.inf), [0.0]])
        r = r[r < cw[-1]]
        gs = _GuideSearch(cw, torch.device("cpu"))
        rt = torch.from_numpy(r)
        assert torch.equal(gs(rt), torch.searchsorted(torch.from_numpy(cw), rt, right=True)), n


def test_generator_is_a_pure_function_of_seed_and_threads():
    a = powerlaw(3000, 50_000, 8, 5, seed=2)
    t = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        b = powerlaw(3000, 50_000, 8, 5, seed=2)
    finally:
        torch.set_num_threads(t)
    assert a.fingerprint() == b.fingerprint()
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.x, b.x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_generates_the_cpu_graph():
    for g_cpu, g_gpu in ((powerlaw(5000, 200_000, 16, 7, seed=4), powerlaw(5000, 200_000, 16, 7, seed=4, device="cuda")),
                         (preset("products-like", 0.01, seed=1), preset("products-like", 0.01, seed=1, device="cuda"))):
        for k in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
            assert np.array_equal(getattr(g_cpu, k), getattr(g_gpu, k)), k
