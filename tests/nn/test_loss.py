"""mgg.nn.cross_entropy_sum against the cross entropy and its gradient in float64 (numpy)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mgg.nn import cross_entropy_sum


def _reference(logits: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """(sum_i logsumexp(l_i) - l_i[t_i], softmax - one_hot), float64."""
    m = logits.max(1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(1))
    loss = float((lse - logits[np.arange(len(target)), target]).sum())
    grad = np.exp(logits - lse[:, None])
    grad[np.arange(len(target)), target] -= 1.0
    return loss, grad


@pytest.mark.parametrize("k,c", [(1, 2), (37, 5), (1000, 47)])
def test_cross_entropy_sum_matches_float64(k, c):
    rng = np.random.default_rng(k)
    logits = (rng.standard_normal((k, c)) * 4).astype(np.float32)
    target = rng.integers(0, c, k)
    want, want_grad = _reference(logits.astype(np.float64), target)
    x = torch.from_numpy(logits).requires_grad_()
    loss = cross_entropy_sum(x, torch.from_numpy(target))
    loss.backward()
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert abs(float(loss) - want) <= 1e-5 * max(1.0, abs(want))
    np.testing.assert_allclose(x.grad.numpy(), want_grad, rtol=1e-4, atol=1e-6)


def test_cross_entropy_sum_of_no_rows_is_zero_with_a_gradient():
    x = torch.zeros(0, 3, requires_grad=True)
    loss = cross_entropy_sum(x, torch.zeros(0, dtype=torch.int64))
    loss.backward()
    assert float(loss) == 0.0 and x.grad.shape == (0, 3)


def test_cross_entropy_sum_names_bad_shapes():
    with pytest.raises(ValueError, match=r"logits \[k, C\] and target \[k\].*\(4, 3\) and \(5,\)"):
        cross_entropy_sum(torch.zeros(4, 3), torch.zeros(5, dtype=torch.int64))
