"""The host hash dropout (mgg.nn.dropout_host): the unblocked ops' values bit for bit, forward and
backward, and nothing of x's size kept between them."""
import pytest
import torch

from mgg.nn import dropout_host
from mgg.nn.functional import hash_uniform_host, seeded_dropout


def _unblocked(x, p, seed, row0, row_scale):
    keep = hash_uniform_host(row0, x.shape[0], x.shape[1], seed) >= p
    out = x * keep.to(x.dtype) / (1.0 - p)
    return out if row_scale is None else out * row_scale.to(out.dtype).unsqueeze(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scaled", [False, True])
def test_blocks_give_the_unblocked_values_and_gradients(monkeypatch, dtype, scaled):
    monkeypatch.setattr(dropout_host, "ROWS_BLOCK_ELEMENTS", 40)  # 5 rows of 8 a block: many blocks
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 8, dtype=dtype, generator=g)
    rs = torch.rand(37, generator=g) + 0.5 if scaled else None
    seed, row0, p = 123456789012345, 1000, 0.4
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    out = seeded_dropout(a, p, seed, row0, rs)
    ref = _unblocked(b, p, seed, row0, rs)
    assert torch.equal(out, ref)
    up = torch.randn(37, 8, dtype=dtype, generator=g)
    out.backward(up)
    ref.backward(up)
    assert torch.equal(a.grad, b.grad)
    kept = (out != 0).float().mean().item()
    assert 0.45 < kept < 0.75  # about 1 - p of the entries survive


def test_nothing_of_the_input_size_is_kept_for_the_backward():
    x = torch.randn(500, 64, requires_grad=True)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = seeded_dropout(x, 0.5, 7, 0)
        ref_saved = list(saved)
        saved.clear()
        _unblocked(x, 0.5, 7, 0, None)
    assert sum(ref_saved) == 0                         # the host dropout keeps only its seed
    assert sum(saved) >= x.numel() * x.element_size()  # the unblocked ops keep a float mask
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad != 0, y != 0)
