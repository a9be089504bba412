"""Small helpers for comparing results in tests."""
from __future__ import annotations

import numpy as np

__all__ = ["leaf", "rel_err"]


def leaf(t):
    """A copy of the tensor `t` detached from its graph, requiring grad: the input of an
    independent reference computation whose gradients are compared with `t`'s."""
    return t.detach().clone().requires_grad_(True)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| (Frobenius; the denominator at least 1e-30) as a Python float."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
