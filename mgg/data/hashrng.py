"""Counter-based random numbers as torch ops: pure functions of (key, counter), bit-identical on
the CPU and on CUDA (integer ops that never overflow int64, IEEE-exact conversions only).

The mixer is `lowbias32` (C. Wellons) on 32-bit values held in int64 tensors; its second
multiplier is written as a negative constant congruent mod 2^32, so every product stays below
2^63 in magnitude (no int64 wrap-around, which C++ leaves undefined). A *stream* is a chain:
word 0 = mix(counter ^ key_0), word k = mix(word k-1 ^ key_k), so one call gives several
32-bit words per counter.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["M32", "mix32", "stream_keys", "words", "uniform53", "below24", "approx_normal"]

M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x846CA68B - (1 << 32)  # == 0x846CA68B mod 2^32, |_C2| < 2^31


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 values in [0, 2^32); returns int64 in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 16)


def stream_keys(seed: int, stream: int, count: int) -> list[int]:
    """`count` 32-bit keys of stream `stream` of `seed` (numpy SeedSequence: platform independent)."""
    return [int(k) for k in np.random.SeedSequence([int(seed) & (2 ** 63 - 1), 0x6D67, int(stream)])
            .generate_state(count, dtype=np.uint32)]


def words(counter: torch.Tensor, keys: list[int], k: int) -> list[torch.Tensor]:
    """`k` int64 32-bit words per counter (int64 in [0, 2^32)): w_0 = mix(c ^ keys[0]),
    w_j = mix(w_{j-1} ^ keys[j]). Needs len(keys) >= k."""
    h = mix32(counter ^ keys[0])
    out = [h]
    for j in range(1, k):
        h = mix32(h ^ keys[j])
        out.append(h)
    return out


def uniform53(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 in [0, 1) with 53 random bits from two 32-bit words (exact on any device)."""
    return ((a >> 5) * 67108864 + (b >> 6)).to(torch.float64) * (1.0 / 9007199254740992.0)


def below24(w: torch.Tensor, p: float) -> torch.Tensor:
    """bool: float32(w >> 8) * 2^-24 < float32(p), decided on integers (the float32 test of
    `np.random.Generator.random(dtype=float32) < float32(p)` with the word's top 24 bits)."""
    thr = int(np.ceil(float(np.float32(p)) * (1 << 24)))
    return (w >> 8) < thr


_IH_SCALE = float(np.float32(1.0 / np.sqrt(4 * ((1 << 16) ** 2 - 1) / 12.0)))


def approx_normal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 approximately N(0, 1) from two 32-bit words: the Irwin-Hall sum of their four 16-bit
    halves, centred and scaled to unit variance (bounded at +-3.46; integer sum, then one exact
    conversion and one float32 multiply: identical on any device)."""
    s = (a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16) - 2 * 0xFFFF
    return s.to(torch.float32) * _IH_SCALE
