"""`StreamRef`: a raw `cudaStream_t` in the CUDA stream protocol.

Lives in the runtime core so the NVSHMEM store (its barriers run on torch's current stream) and
the kernel launchers (mgg.kernels.streams, CuPy launches) share one class without the store
importing the kernels.
"""
from __future__ import annotations

__all__ = ["StreamRef"]


class StreamRef:
    """A raw `cudaStream_t` in the CUDA stream protocol (version 0), which CuPy's
    `Stream.from_external` and nvshmem4py's `stream=` arguments accept."""

    def __init__(self, handle: int):
        self.handle = int(handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)
