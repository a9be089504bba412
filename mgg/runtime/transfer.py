"""Large host <-> GPU copies through pinned staging buffers, with the host side on threads.

A plain ``tensor.cpu()`` of a multi-GiB array copies into fresh pageable memory: the driver
stages it and every destination page faults on first touch, one thread. On the device machine
that ran at 1.5 GB/s (papers-like@0.1's plans: 5.2 GiB in 4.7 s, 95% of the plan phase), and
``torch.from_numpy(a).to("cuda")`` is no faster. Here the GPU side of each chunk is one
``cudaMemcpyAsync`` into (out of) a reused pinned buffer, and the host side -- the copy between
that buffer and the numpy array, page faults included -- is split over a thread pool (numpy's
copy releases the GIL), while the next chunk's DMA runs. Two staging buffers alternate.

A memory map of a file (what mgg.data maps a prepared graph's members with) is read from the file
into the staging buffers with positioned reads (mgg.data.rows.pread_into), not through the map:
its pages go through the page cache only and never count in this process's resident set (a scan
of papers-like@0.3's 3.9 GB of indices would otherwise stay in every rank's RSS).

Small arrays (< DIRECT_BYTES) take the plain path. Results are ordinary numpy arrays / tensors.
"""
from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..data.rows import mapped_file, pread_into

__all__ = ["device_to_host", "host_to_device", "DIRECT_BYTES", "STAGE_BYTES"]

#: below this many bytes a copy is a plain .cpu() / .to(device)
DIRECT_BYTES = 32 << 20
#: bytes per staging buffer (two of them alternate)
STAGE_BYTES = 64 << 20


def _threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    step = -(-n // parts)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _stages(device: torch.device) -> list[torch.Tensor]:
    return [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]


def device_to_host(t: torch.Tensor) -> np.ndarray:
    """A new numpy array holding the CUDA tensor `t` (any shape and numeric dtype)."""
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cuda" or nbytes < DIRECT_BYTES:
        return t.cpu().numpy()
    src = t.contiguous().reshape(-1).view(torch.uint8)
    out = np.empty(tuple(t.shape), dtype=torch.empty(0, dtype=t.dtype).numpy().dtype)
    dst = out.reshape(-1).view(np.uint8)
    stages = _stages(t.device)
    views = [s.numpy() for s in stages]
    stream = torch.cuda.current_stream(t.device)
    pending: list[list] = [[], []]
    with ThreadPoolExecutor(_threads()) as pool:
        for i, off in enumerate(range(0, nbytes, STAGE_BYTES)):
            k, m = i % 2, min(STAGE_BYTES, nbytes - off)
            for f in pending[k]:  # the host copies still reading this buffer
                f.result()
            stages[k][:m].copy_(src[off: off + m], non_blocking=True)
            stream.synchronize()
            pending[k] = [pool.submit(np.copyto, dst[off + a: off + b], views[k][a:b])
                          for a, b in _split(m, _threads())]
        for fs in pending:
            for f in fs:
                f.result()
    return out


def fill_stage(stage: np.ndarray, src: np.ndarray, off: int, file: tuple[str, int] | None, pool) -> None:
    """stage (uint8 [m]) = the bytes [off, off + m) of `src` (a flat uint8 view of the array):
    positioned reads of the file when `file` = (path, offset of src's first byte) is given (the
    map is not touched), else copies on the thread pool `pool`."""
    m = stage.shape[0]
    if file is not None and pread_into(file[0], stage, file[1] + off):
        return
    list(pool.map(lambda ab: np.copyto(stage[ab[0]:ab[1]], src[off + ab[0]: off + ab[1]]), _split(m, _threads())))


def host_to_device(a: np.ndarray, device: torch.device | str, dtype=None) -> torch.Tensor:
    """A new tensor on CUDA `device` holding the array `a` (converted to `dtype`, a torch or
    numpy dtype, on the GPU when given)."""
    device = torch.device(device)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        dtype = torch.from_numpy(np.empty(0, dtype)).dtype
    file = mapped_file(a)
    a = np.ascontiguousarray(a)
    if device.type != "cuda" or a.nbytes < DIRECT_BYTES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only map: only read
            t = torch.from_numpy(a).to(device)
        return t if dtype is None else t.to(dtype)
    out = torch.empty(a.shape, dtype=torch.from_numpy(np.empty(0, a.dtype)).dtype, device=device)
    dst = out.reshape(-1).view(torch.uint8)
    src = a.reshape(-1).view(np.uint8)
    stages = _stages(device)
    views = [s.numpy() for s in stages]
    stream = torch.cuda.current_stream(device)
    done: list[torch.cuda.Event | None] = [None, None]
    nbytes = a.nbytes
    with ThreadPoolExecutor(_threads()) as pool:
        for i, off in enumerate(range(0, nbytes, STAGE_BYTES)):
            k, m = i % 2, min(STAGE_BYTES, nbytes - off)
            if done[k] is not None:  # the DMA still reading this buffer
                done[k].synchronize()
            fill_stage(views[k][:m], src, off, file, pool)
            dst[off: off + m].copy_(stages[k][:m], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
            done[k] = ev
    stream.synchronize()
    return out if dtype is None else out.to(dtype)
