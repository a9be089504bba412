"""mgg.runtime.transfer on the CPU (the staged CUDA path: tests/runtime/test_transfer_gpu.py)."""
import numpy as np
import torch

from mgg.runtime.transfer import device_to_host, host_to_device


def test_cpu_round_trip_is_a_plain_copy():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    t = host_to_device(a, "cpu", torch.int32)
    assert t.dtype == torch.int32 and t.tolist() == a.tolist()
    assert np.array_equal(device_to_host(t), a.astype(np.int32))
    assert host_to_device(a, "cpu", np.float32).dtype == torch.float32  # a numpy dtype works too
