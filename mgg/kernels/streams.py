"""torch's CUDA streams for CuPy launches and nvshmem4py calls.

CuPy 14 deprecates `cupy.cuda.ExternalStream` in favour of `cupy.cuda.Stream.from_external(obj)`,
which takes any object with the CUDA stream protocol (`__cuda_stream__() -> (version, handle)`);
older CuPy only has `ExternalStream`. `torch_stream_for_cupy` uses whichever the installed CuPy has.
"""
from __future__ import annotations

import torch

from ..runtime.stream_ref import StreamRef

__all__ = ["StreamRef", "torch_stream_for_cupy", "cuda_index", "on_device", "LaunchCache"]


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


def cuda_index(device: torch.device | int | None) -> int:
    """The CUDA index of `device` (None, or "cuda" without an index: the current GPU)."""
    if isinstance(device, int):
        return device
    if device is None or device.index is None:
        return torch.cuda.current_device()
    if device.type != "cuda":
        raise ValueError(f"a CUDA kernel needs a CUDA device, got {device}")
    return device.index


class on_device:
    """Context: `device` current for CuPy and torch's current stream of it as CuPy's current
    stream, so launches inside go to that GPU, ordered with torch's work on it. (A class, not a
    generator: it runs around every launch.)"""

    __slots__ = ("_dev", "_stream")

    def __init__(self, device: torch.device | int | None, stream=None):
        import cupy

        idx = cuda_index(device)
        self._dev = cupy.cuda.Device(idx)
        self._stream = stream if stream is not None else torch_stream_for_cupy(idx)

    def __enter__(self):
        self._dev.__enter__()
        return self._stream.__enter__()

    def __exit__(self, *exc):
        self._stream.__exit__(*exc)
        return self._dev.__exit__(*exc)


class LaunchCache:
    """An executor's launch-time handles on its GPU, built once instead of per launch: CuPy
    `Function`s by (module, name), and the CuPy view of each torch stream it launched on (by
    stream handle, at most `max_streams` kept). Both are host-side costs of every aggregation
    call otherwise. `device`: the executor's GPU (None: the current one when the cache is made)."""

    def __init__(self, max_streams: int = 8, device: torch.device | int | None = None):
        self._fns: dict = {}
        self._streams: dict = {}
        self.max_streams = max_streams
        if isinstance(device, torch.device):
            device = device.index
        self.device = torch.cuda.current_device() if device is None else int(device)

    def function(self, module, name: str):
        # keyed by the module itself, not its id(): the key keeps it alive, so a module swapped
        # in later (a bench's other cubin) can never reuse a freed one's id and get its functions
        key = (module, name)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = module.get_function(name)
        return fn

    def stream(self):
        """A context manager: the cache's GPU current, torch's current stream of it as CuPy's
        stream (mgg.kernels.launch.on_device)."""
        handle = torch.cuda.current_stream(self.device).cuda_stream
        st = self._streams.get(handle)
        if st is None:
            if len(self._streams) >= self.max_streams:
                self._streams.clear()
            st = self._streams[handle] = torch_stream_for_cupy(self.device)
        return on_device(self.device, st)
