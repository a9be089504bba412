"""mgg.runtime.transfer: staged, threaded copies equal the plain ones (sizes around the chunk and
staging boundaries, several dtypes)."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mgg.runtime import transfer  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.bool_])
def test_staged_copies_round_trip(dtype, monkeypatch):
    monkeypatch.setattr(transfer, "DIRECT_BYTES", 1000)
    monkeypatch.setattr(transfer, "STAGE_BYTES", 4096)
    rng = np.random.default_rng(0)
    for n in (1000, 4096 * 3 + 17, 50_000):
        a = (rng.standard_normal(n) * 1000).astype(dtype).reshape(-1, 1) if dtype != np.bool_ else \
            (rng.random((n, 1)) > 0.5)
        t = transfer.host_to_device(a, "cuda")
        assert t.is_cuda and torch.equal(t.cpu(), torch.from_numpy(a))
        back = transfer.device_to_host(t)
        assert back.dtype == a.dtype and np.array_equal(back, a)
    t = transfer.host_to_device(np.arange(9000, dtype=np.int64), "cuda", torch.int32)
    assert t.dtype == torch.int32 and torch.equal(t.cpu(), torch.arange(9000, dtype=torch.int32))


def test_a_mapped_file_uploads_from_the_file(tmp_path, monkeypatch):
    """A memory-mapped array (staged from the file with positioned reads) arrives whole, at every
    size around the staging boundaries, converted when asked."""
    monkeypatch.setattr(transfer, "DIRECT_BYTES", 1000)
    monkeypatch.setattr(transfer, "STAGE_BYTES", 4096)
    a = np.random.default_rng(1).integers(-(1 << 40), 1 << 40, 50_000, dtype=np.int64)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    for n in (200, 512 * 3 + 5, 50_000):
        t = transfer.host_to_device(m[:n] if n < len(a) else m, "cuda")
        assert torch.equal(t.cpu(), torch.from_numpy(a[:n]))
    t = transfer.host_to_device(m, "cuda", torch.int64)
    assert torch.equal(t.cpu(), torch.from_numpy(a))
