"""torch's CUDA streams for CuPy launches and nvshmem4py calls.

CuPy 14 deprecates `cupy.cuda.ExternalStream` in favour of `cupy.cuda.Stream.from_external(obj)`,
which takes any object with the CUDA stream protocol (`__cuda_stream__() -> (version, handle)`);
older CuPy only has `ExternalStream`. `torch_stream_for_cupy` uses whichever the installed CuPy has.
"""
from __future__ import annotations

import torch

from ..runtime.stream_ref import StreamRef

__all__ = ["StreamRef", "torch_stream_for_cupy", "LaunchCache", "resident_blocks"]


def resident_blocks(regs_per_thread: int, threads: int, smem_per_block: int = 0) -> int:
    """Blocks of `threads` threads using `regs_per_thread` registers (0: unknown, only the thread
    limit applies) and `smem_per_block` static shared bytes that fit on one SM of compute
    capability 9.0 at once: 64K registers (allocated per warp in units of 256), 2048 threads,
    32 blocks, 228 KB of shared memory (1 KB reserved per block). At least 1."""
    warps = -(-threads // 32)
    by_threads = 2048 // (32 * warps)
    n = min(32, by_threads)
    if regs_per_thread:
        per_warp = -(-regs_per_thread * 32 // 256) * 256
        n = min(n, (65536 // per_warp) // warps)
    if smem_per_block:
        n = min(n, (228 * 1024) // (smem_per_block + 1024))
    return max(1, n)


def torch_stream_for_cupy(device: torch.device | int | None = None):
    """The current torch stream of `device` (default: the current device) as a CuPy stream.

    Use as a context manager (`with torch_stream_for_cupy(dev): kernel(...)`) or pass as
    `stream=`. The caller keeps torch's stream alive while the returned object is in use."""
    import cupy

    ts = torch.cuda.current_stream(device)
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(StreamRef(ts.cuda_stream))
    return cupy.cuda.ExternalStream(ts.cuda_stream, ts.device.index)


class LaunchCache:
    """An executor's launch-time handles, built once instead of per launch: CuPy `Function`s by
    (module, name), and the CuPy view of each torch stream it launched on (by stream handle, at
    most `max_streams` kept). Both are host-side costs of every aggregation call otherwise."""

    def __init__(self, max_streams: int = 8):
        self._fns: dict = {}
        self._streams: dict = {}
        self._resident: dict = {}
        self.max_streams = max_streams

    def function(self, module, name: str):
        key = (id(module), name)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = module.get_function(name)
        return fn

    def resident_blocks(self, fn, threads: int) -> int:
        """Blocks of `threads` threads of CuPy Function `fn` that fit on one SM at once (kept per
        function and block size): the driver's occupancy query, or else the estimate of
        `resident_blocks` from the function's register count."""
        key = (id(fn), threads)
        n = self._resident.get(key)
        if n is None:
            try:  # the driver's answer where CuPy exposes it
                from cupy.cuda import driver

                n = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, threads, 0))
            except (ImportError, AttributeError, TypeError):
                n = 0
            if n < 1:
                n = resident_blocks(int(getattr(fn, "num_regs", 0) or 0), threads,
                                    int(getattr(fn, "shared_size_bytes", 0) or 0))
            self._resident[key] = n
        return n

    def stream(self):
        """The current torch stream as a CuPy stream (a context manager, as torch_stream_for_cupy)."""
        handle = torch.cuda.current_stream().cuda_stream
        st = self._streams.get(handle)
        if st is None:
            if len(self._streams) >= self.max_streams:
                self._streams.clear()
            st = self._streams[handle] = torch_stream_for_cupy()
        return st
