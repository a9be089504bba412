"""The first layer's aggregation of a constant input, computed once (`InputAggregationCache`).

A model's input features x do not change between epochs and need no gradient. When nothing
random touches x before the first convolution (no input dropout: dropout 0, or evaluation), that
convolution's aggregation of x -- A_kind x, a graph-only function of x -- is the same every
step, and the first layer can start from it: GCN's A (x W) == (A x) W, GIN's (A + I)(x W) ==
((A + I) x) W, SAGE's mean(x W) == mean(x) W. Each step then runs the first layer's Linear on the
cached rows (a GEMM) and no first-layer aggregation at all, forward or backward (x has no
gradient, and W's gradient is (A x)^T g). Results equal the uncached order up to float rounding.

The cache is one float32 [n_local, F] tensor per rank (as large as x), built on the first
forward that can use it by ceil(F / chunk) aggregations of `chunk` columns each (`chunk` = the
width the layer aggregates anyway, so no new symmetric buffers are allocated at P > 1), and
rebuilt whenever x (the tensor object, its storage, shape or in-place version), the DistGraph or
the kind change.
Building it is collective: every rank reaches it in the same forward, as every aggregation.
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["InputAggregationCache", "MAX_CHUNK"]

#: widest column block aggregated in one call (the GPU kernels take rows of up to 512 floats)
MAX_CHUNK = 256


class InputAggregationCache:
    """Holds A_kind x for one input x and one DistGraph (see the module docstring).

    Attributes:
        builds: how many times the aggregation was computed (tests and reports read it).
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._dg_ref = self._x_ref = None
        self._value: torch.Tensor | None = None
        self.builds = 0

    @staticmethod
    def _key_of(x: torch.Tensor, kind: str) -> tuple:
        return (x.data_ptr(), tuple(x.shape), tuple(x.stride()), x._version, x.dtype, x.device, kind)

    def get(self, x: torch.Tensor, dg, kind: str, chunk: int | None = None) -> torch.Tensor:
        """[n_local, F] in x's dtype: dg's aggregation `kind` of x (no autograd), computed on a miss in
        column blocks of `chunk` columns (None: F; at most MAX_CHUNK). Collective on a miss."""
        key = self._key_of(x, kind)
        # the same tensor object too (weakly held): a new x that happens to reuse a freed x's
        # address, shape and version must not hit
        if (self._value is not None and key == self._key and self._dg_ref() is dg
                and self._x_ref() is x):
            return self._value
        self._value = None  # drop the old one before building the new one
        chunk = max(1, min(MAX_CHUNK, int(x.shape[1]) if chunk is None else int(chunk)))
        with torch.no_grad():
            f = int(x.shape[1])
            if f <= chunk:
                value = dg.aggregate(x.contiguous(), kind)[:, :f]
            else:
                value = torch.empty(x.shape, dtype=x.dtype, device=x.device)
                for a in range(0, f, chunk):
                    b = min(f, a + chunk)
                    value[:, a:b] = dg.aggregate(x[:, a:b].contiguous(), kind)[:, : b - a]
        self._value = value.contiguous()
        self._key, self._dg_ref, self._x_ref = key, weakref.ref(dg), weakref.ref(x)
        self.builds += 1
        return self._value

    def __getstate__(self) -> dict:
        """Pickled and deep-copied empty (a saved or copied model rebuilds its cache on use)."""
        return {"builds": self.builds}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.builds = int(state.get("builds", 0))

    def clear(self) -> None:
        """Forget the cached tensor (frees its memory)."""
        self._key = self._dg_ref = self._x_ref = self._value = None

    @property
    def nbytes(self) -> int:
        """Bytes held now (0 when empty)."""
        return 0 if self._value is None else self._value.numel() * self._value.element_size()
