"""torch's CUDA streams for CuPy launches and nvshmem4py calls.

CuPy 14 deprecates `cupy.cuda.ExternalStream` in favour of `cupy.cuda.Stream.from_external(obj)`,
which takes any object with the CUDA stream protocol (`__cuda_stream__() -> (version, handle)`);
older CuPy only has `ExternalStream`. `torch_stream_for_cupy` uses whichever the installed CuPy has.
"""
from __future__ import annotations

import torch

from ..runtime.stream_ref import StreamRef

__all__ = ["StreamRef", "torch_stream_for_cupy"]


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
