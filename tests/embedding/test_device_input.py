"""The GPU lookup's host-side input checks (mgg.embedding.device_input): whatever can be refused
without reading values is refused with check_bag_input's own error, and valid input reaches the
kernel in the dtypes it reads, converted only when it must be. Runs on the CPU (device "cpu")."""
import numpy as np
import pytest
import torch

from mgg.embedding.device_input import device_bag_input
from mgg.embedding.lookup_counters import LookupCounters
from mgg.embedding.validate import check_bag_input

CPU = torch.device("cpu")

BAD = [  # (indices, offsets, per_sample_weights, mode, include_last_offset)
    (torch.arange(6), None, None, "sum", False),                     # 1-D without offsets
    (torch.arange(6).reshape(2, 3), torch.tensor([0, 3]), None, "sum", False),  # 2-D with offsets
    (torch.arange(6).float(), torch.tensor([0]), None, "sum", False),  # float ids
    (torch.arange(6), torch.tensor([0.0]), None, "sum", False),       # float offsets
    (torch.arange(6), torch.tensor([[0]]), None, "sum", False),       # 2-D offsets
    (torch.arange(6), torch.tensor([], dtype=torch.int64), None, "sum", False),  # ids in no bag
    (torch.arange(6), torch.tensor([], dtype=torch.int64), None, "sum", True),   # no last offset
    (torch.arange(6), torch.tensor([0, 3]), torch.ones(6), "max", False),        # weights with max
    (torch.arange(6), torch.tensor([0, 3]), torch.ones(5), "sum", False),        # weights too short
    (torch.arange(6), torch.tensor([0, 3]), torch.ones(6, dtype=torch.int64), "sum", False),
    (torch.arange(6).reshape(2, 3), None, torch.ones(3, 2), "sum", False),       # weights of another shape
    (torch.arange(6), torch.tensor([0, 3]), None, "median", False),
    ("ids", torch.tensor([0]), None, "sum", False),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_refused_with_the_host_checks_error(case):
    idx, off, psw, mode, last = BAD[case]
    with pytest.raises((TypeError, ValueError)) as want:
        check_bag_input(idx, off, psw, num_embeddings=10, mode=mode, include_last_offset=last, what="table t")
    with pytest.raises(want.type) as got:
        device_bag_input(idx, off, psw, mode=mode, include_last_offset=last, device=CPU, what="table t")
    assert str(got.value) == str(want.value)


def test_valid_input_reaches_the_kernel_as_given():
    ids = torch.arange(7, dtype=torch.int32)
    off = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
    b = device_bag_input(ids, off, None, mode="sum", include_last_offset=True, device=CPU)
    assert b.ids is ids and b.offsets is off and b.num_bags == 3 and (b.copies, b.conversions) == (0, 0)
    b = device_bag_input(ids, off, None, mode="sum", include_last_offset=False, device=CPU)
    assert b.num_bags == 4  # the last bag runs to the end of the ids

    small = torch.arange(7, dtype=torch.int16)
    w = torch.ones(14, dtype=torch.float64)[::2]  # float64 and not contiguous
    b = device_bag_input(small, [0, 3], w, mode="sum", include_last_offset=False, device=CPU)
    assert b.ids.dtype == torch.int64 and b.offsets.dtype == torch.int64
    assert b.per_sample_weights.dtype == torch.float32 and b.per_sample_weights.is_contiguous()
    assert b.conversions == 2 and torch.equal(b.ids, torch.arange(7))  # ids and weights (the cast makes them contiguous)

    b = device_bag_input(np.arange(12).reshape(4, 3), None, None, mode="mean", include_last_offset=False, device=CPU)
    assert b.offsets is None and (b.num_bags, b.bag_size) == (4, 3) and b.ids.shape == (12,)


def test_counters_per_call():
    c = LookupCounters()
    assert np.isnan(c.per_call()["launches"])
    c.calls, c.launches, c.host_syncs = 4, 4, 2
    assert c.per_call()["launches"] == 1.0 and c.per_call()["host_syncs"] == 0.5
    c.reset()
    assert c.snapshot() == {"calls": 0, "launches": 0, "host_syncs": 0, "h2d_copies": 0, "d2h_copies": 0, "barriers": 0}
