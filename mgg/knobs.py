"""The runtime's settings as names and numbers, the one place each is defined: the plan knobs of MGG
(ps, dist, wpb, ps_inter) with their defaults and ranges, the backends, the storage dtypes and the
embedding service's address and limits.

mgg.runtime.plan.PlanParams validates against `KNOB_RANGES`, mgg.graph.RuntimeConfig and
PlanParams take `KNOB_DEFAULTS`, and the training command line's --ps/--dist/--wpb/--ps-inter
(mgg.apps.config) read both for their checks and help. mgg.embedding.service.ServiceConfig and the
flags of mgg.serve take `SERVICE_DEFAULTS`. Importing this module is cheap (no torch).
"""
from __future__ import annotations

import numbers

__all__ = ["KNOB_DEFAULTS", "KNOB_RANGES", "KNOB_MEANINGS", "BACKENDS", "STORAGE_DTYPE_NAMES", "SERVICE_DEFAULTS",
           "check_knob"]

#: ps, dist and wpb when not given (and not tuned)
KNOB_DEFAULTS: dict[str, int] = {"ps": 16, "dist": 4, "wpb": 4}
#: [lo, hi] of every plan knob; ps_inter (the partition size of other-node remote neighbors) is a ps
KNOB_RANGES: dict[str, tuple[int, int]] = {"ps": (1, 1024), "dist": (1, 16), "wpb": (1, 32), "ps_inter": (1, 1024)}
#: what each knob is, in the words of the flags' help
KNOB_MEANINGS: dict[str, str] = {"ps": "neighbor partition size", "dist": "interleave distance",
                                 "wpb": "warps per block",
                                 "ps_inter": "partition size of remote neighbors on other nodes"}
#: --backend: "auto" (the GPU when CUDA and the gpu extra are usable, else the CPU), "cpu" or "gpu"
BACKENDS = ("auto", "cpu", "gpu")
#: --storage-dtype: the element type of embeddings in the symmetric store (fp32 first, the default)
STORAGE_DTYPE_NAMES = ("fp32", "bf16", "fp16")
#: the embedding service's address, per-request limits, batching, connections and watchdog when not
#: given (their meaning: mgg.embedding.service.ServiceConfig; *_ms milliseconds, *_s seconds)
SERVICE_DEFAULTS: dict[str, int | float | str] = {
    "host": "127.0.0.1", "port": 8700, "max_body_bytes": 16 << 20, "max_bags": 65536, "max_reply_bytes": 16 << 20,
    "max_batch": 64, "max_wait_ms": 2.0, "max_batch_ids": 2048, "request_timeout_s": 60.0, "max_connections": 4096,
    "idle_timeout_s": 15.0, "io_timeout_s": 30.0, "watchdog_timeout_s": 30.0}


def check_knob(name: str, value) -> None:
    """ValueError unless `value` is an integer (not a bool) in KNOB_RANGES[name]."""
    lo, hi = KNOB_RANGES[name]
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not lo <= int(value) <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
