"""torch's CUDA streams for CuPy launches and nvshmem4py calls.

CuPy 14 deprecates `cupy.cuda.ExternalStream` in favour of `cupy.cuda.Stream.from_external(obj)`,
which takes any object with the CUDA stream protocol (`__cuda_stream__() -> (version, handle)`);
older CuPy only has `ExternalStream`. `torch_stream_for_cupy` uses whichever the installed CuPy has.
"""
from __future__ import annotations

import torch

from ..runtime.stream_ref import StreamRef

__all__ = ["StreamRef", "torch_stream_for_cupy", "LaunchCache"]


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
        self.max_streams = max_streams

    def function(self, module, name: str):
        key = (id(module), name)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = module.get_function(name)
        return fn

    def stream(self):
        """The current torch stream as a CuPy stream (a context manager, as torch_stream_for_cupy)."""
        handle = torch.cuda.current_stream().cuda_stream
        st = self._streams.get(handle)
        if st is None:
            if len(self._streams) >= self.max_streams:
                self._streams.clear()
            st = self._streams[handle] = torch_stream_for_cupy()
        return st
