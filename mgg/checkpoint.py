"""Checkpoint/resume and graceful stop (SIGTERM) for `mgg.train`.

A checkpoint is one file written by rank 0, atomically (temporary file in the same folder, fsync,
`os.replace`; the temporary files a crash leaves are removed at the start of the next run and
before every write, mgg.atomic.remove_stale_temporaries); the folder keeps the newest (`checkpoint.mgg`) and the one before it
(`checkpoint.prev.mgg`). Layout::

    b"MGGCKPT1\\n"
    {"format": 1, "payload_bytes": N, "sha256": "<hex of the payload>", "epoch": E, ...}\\n
    <N payload bytes: torch.save() of the state dict, read back with weights_only=True>

The state holds the weights, the optimizer state, the epoch, every RNG state training draws
from (torch's global CPU generator, the dropout generator, numpy's and Python's), the loss and
accuracy history, a `tuner` dict (filled by the tuner), the resolved config, the graph
fingerprint, the world size and the mgg version. Reading verifies the magic, the size (a
truncated file is named as such) and the checksum before unpickling anything, then
`check_compatible` refuses a checkpoint of another graph, world size or model configuration.

`load_for_resume` reads on rank 0 and broadcasts, so every rank either gets the same state or
raises the same `CheckpointError`. `StopSignal` turns SIGTERM (Slurm's pre-kill signal), SIGINT
(Ctrl-C) and SIGUSR1 into a flag the training loop agrees on at the end of an epoch.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import signal
import sys
import threading
from typing import Any, Callable

import numpy as np

from .atomic import atomic_write, remove_stale_temporaries

__all__ = ["CheckpointError", "Checkpointer", "StopSignal", "LAST", "PREV", "MAGIC", "read_newest",
           "STRICT_CONFIG_KEYS", "encode", "write_checkpoint", "read_checkpoint", "find_checkpoint",
           "resolve_resume", "check_compatible", "graph_fingerprint", "capture_state",
           "restore_state", "load_for_resume"]

MAGIC = b"MGGCKPT1\n"
FORMAT = 1
LAST = "checkpoint.mgg"
PREV = "checkpoint.prev.mgg"
#: Config fields a resumed run must share with the checkpoint (they change the numbers); the
#: others (epochs, ps/dist/wpb/ps_inter, backend, eval cadence, output paths) may differ.
STRICT_CONFIG_KEYS = ("model", "hidden", "layers", "dropout", "lr", "weight_decay", "seed")
_REQUIRED = ("epoch", "model", "optimizer", "rng", "history", "last_eval", "tuner", "config",
             "fingerprint", "world_size", "mgg_version")
_MAX_HEADER = 4096


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the problem."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"checkpoint {self.path}: {problem}")


# -- file format --------------------------------------------------------------------------------
def encode(state: dict) -> bytes:
    """The bytes of a checkpoint file holding `state`."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = {"format": FORMAT, "payload_bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest(), "epoch": int(state.get("epoch", -1)),
              "mgg_version": str(state.get("mgg_version", "?"))}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def write_checkpoint(directory: str | os.PathLike, state: dict) -> str:
    """Write `state` as DIR/checkpoint.mgg atomically; the previous one becomes checkpoint.prev.mgg.

    Returns the path written. A crash at any point leaves at least one complete checkpoint
    (the old `last` or `prev`) and never a partial file under either name; the temporary file
    such a crash leaves (``.tmp-*-checkpoint.mgg``) is removed by the next write.
    """
    d = os.path.abspath(os.fspath(directory))
    data = encode(state)
    last, prev = os.path.join(d, LAST), os.path.join(d, PREV)
    remove_stale_temporaries(last)  # never one a live writer holds (mgg.atomic)

    def keep_previous() -> None:  # after the new file is on disk, before it takes `last`'s name
        if os.path.exists(last):
            os.replace(last, prev)

    # the mode follows the umask (mgg/atomic.py), as every other file mgg writes
    atomic_write(last, lambda f: f.write(data), before_replace=keep_previous)
    return last


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Read and verify a checkpoint file. Raises CheckpointError (never another type) when the
    file is missing, not a checkpoint, truncated, corrupt (checksum) or incomplete."""
    import torch

    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {_unreadable(path, e)}") from e
    if not data.startswith(MAGIC):
        raise CheckpointError(path, "not an mgg checkpoint (bad magic; truncated or another file type)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        raise CheckpointError(path, "truncated or corrupt header")
    try:
        header = json.loads(data[len(MAGIC):end].decode())
        size, digest = int(header["payload_bytes"]), str(header["sha256"])
        fmt = int(header["format"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"corrupt header ({type(e).__name__}: {e})") from e
    if fmt != FORMAT:
        raise CheckpointError(path, f"format {fmt} is not supported (this mgg reads format {FORMAT})")
    payload = data[end + 1:]
    if len(payload) < size:
        raise CheckpointError(path, f"truncated: {len(payload)} of {size} payload bytes present")
    if len(payload) > size:
        raise CheckpointError(path, f"corrupt: {len(payload) - size} unexpected bytes after the payload")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != digest:
        raise CheckpointError(path, f"corrupt: sha256 of the payload is {actual[:16]}..., the header "
                                    f"says {digest[:16]}...")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a verified payload that still fails to load
        raise CheckpointError(path, f"cannot unpack the payload ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise CheckpointError(path, f"payload is a {type(state).__name__}, expected a dict")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(path, f"incomplete: missing {', '.join(missing)}")
    return state


def _unreadable(path: str, e: OSError) -> str:
    """Why `path` could not be opened, naming a broken symbolic link as such."""
    if os.path.islink(path):
        target = os.readlink(path)
        if e.errno == errno.ELOOP:
            return f"a symbolic link (to {target}) that loops"
        if not os.path.exists(path):
            return f"a symbolic link to {target}, which does not exist"
    return e.strerror or str(e)


def find_checkpoint(directory: str | os.PathLike) -> str | None:
    """DIR/checkpoint.mgg, else DIR/checkpoint.prev.mgg (a crash between the two renames), else None.

    Any entry under a name counts, a broken symbolic link or a folder included: reading it then
    fails with the reason (and `read_newest` may fall back to the previous checkpoint), instead
    of a run that silently starts from epoch 0."""
    for name in (LAST, PREV):
        p = os.path.join(os.fspath(directory), name)
        if os.path.lexists(p):
            return p
    return None


def resolve_resume(spec: str | None, checkpoint_dir: str | None) -> str | None:
    """The file `--resume SPEC` means: None (start fresh), or a path that exists.

    `auto`: the newest checkpoint of `checkpoint_dir`, or None when there is none yet (so a
    requeued job script can always pass `--resume auto`). A folder: its newest checkpoint (an
    error when it has none). A file: itself (an error when it does not exist).
    """
    if not spec:
        return None
    if spec == "auto":
        if not checkpoint_dir:
            raise CheckpointError("auto", "--resume auto needs --checkpoint-dir")
        return find_checkpoint(checkpoint_dir) if os.path.isdir(checkpoint_dir) else None
    if os.path.isdir(spec):
        found = find_checkpoint(spec)
        if found is None:
            raise CheckpointError(spec, f"folder holds no {LAST} or {PREV}")
        return found
    if not os.path.lexists(spec):  # a broken symbolic link is read, and named as such
        raise CheckpointError(spec, "file not found")
    return spec


def check_compatible(state: dict, path: str, *, fingerprint: str, world_size: int,
                     config: dict) -> None:
    """Refuse a checkpoint of another run: graph fingerprint, world size, model/optimizer config."""
    problems = []
    if state["fingerprint"] != fingerprint:
        problems.append(f"graph fingerprint {state['fingerprint']} in the checkpoint, {fingerprint} "
                        f"for this dataset (another graph)")
    if int(state["world_size"]) != int(world_size):
        problems.append(f"world size {state['world_size']} in the checkpoint, {world_size} now "
                        f"(resume with the same number of ranks)")
    saved = state["config"]
    for k in STRICT_CONFIG_KEYS:
        if saved.get(k) != config.get(k):
            problems.append(f"{k}={saved.get(k)!r} in the checkpoint, {config.get(k)!r} now")
    if problems:
        raise CheckpointError(path, "belongs to another run: " + "; ".join(problems))


def graph_fingerprint(graph: Any) -> str:
    """`graph.fingerprint()`, or a hash of its CSR for objects without one."""
    fp = getattr(graph, "fingerprint", None)
    if callable(fp):
        return str(fp())
    h = hashlib.blake2b(digest_size=16)
    for a in (graph.indptr, graph.indices):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()


# -- state --------------------------------------------------------------------------------------
def _capture_rng(dropout_gen) -> dict:
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(), "dropout": dropout_gen.get_state(),
            "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next}}


def _restore_rng(rng: dict, dropout_gen) -> None:
    import torch

    torch.set_rng_state(rng["torch"])
    dropout_gen.set_state(rng["dropout"])
    n = rng["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = rng["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


def capture_state(epoch: int, model, optimizer, dropout_gen, *, history: list, last_eval: dict,
                  tuner: dict, config: dict, fingerprint: str, world_size: int, reason: str = "") -> dict:
    """Everything a resumed run needs to continue exactly where this one is (after `epoch`).

    `reason` records why it was written ("periodic", "end", or the signal name, e.g. "SIGTERM").
    """
    from .version import version

    return {"epoch": int(epoch), "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "rng": _capture_rng(dropout_gen),
            "history": [dict(r) for r in history], "last_eval": dict(last_eval),
            "tuner": dict(tuner), "config": dict(config), "fingerprint": str(fingerprint),
            "world_size": int(world_size), "mgg_version": version(), "reason": str(reason)}


def restore_state(state: dict, model, optimizer, dropout_gen, path: str = "?") -> None:
    """Load weights, optimizer and RNG states (shape mismatches -> CheckpointError)."""
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(path, f"does not fit this model: {e}") from e
    try:
        _restore_rng(state["rng"], dropout_gen)
    except (RuntimeError, ValueError, KeyError) as e:  # e.g. a generator's state into DeviceSeeds
        raise CheckpointError(path, f"its random state does not fit this run (with --cuda-graph and dropout the "
                                    f"dropout seeds live on the GPU: leave --cuda-graph/--no-cuda-graph out, and the "
                                    f"run follows the checkpoint's setting): {e}") from e


def read_newest(path: str, fallback: bool) -> tuple[str, dict, str]:
    """Read `path`; when it is a damaged DIR/checkpoint.mgg and DIR/checkpoint.prev.mgg exists,
    use that instead (`fallback`, with a warning) or name it in the error (not `fallback`: the
    user named the file). Returns (path read, state, warning or "")."""
    try:
        return path, read_checkpoint(path), ""
    except CheckpointError as e:
        prev = os.path.join(os.path.dirname(os.path.abspath(path)), PREV)
        if os.path.basename(path) != LAST:
            raise
        if not os.path.lexists(prev):
            if not fallback:
                raise
            raise CheckpointError(e.path, f"{e.problem}; there is no previous checkpoint {PREV} to fall back "
                                          f"on (move the file away to start from epoch 0)") from e
        if not fallback:
            raise CheckpointError(e.path, f"{e.problem}; the previous checkpoint {prev} is still there "
                                          f"(--resume {prev} continues from it)") from e
        try:
            state = read_checkpoint(prev)
        except CheckpointError as e2:
            raise CheckpointError(e.path, f"{e.problem}; the previous checkpoint {prev} is unusable "
                                          f"too: {e2.problem}") from e2
        return prev, state, (f"warning: checkpoint {e.path} is unusable ({e.problem}); resuming from "
                             f"the previous checkpoint {prev} (epoch {state['epoch']}) instead")


def load_for_resume(spec: str | None, checkpoint_dir: str | None, comm, *, fingerprint: str,
                    config: dict) -> tuple[str, dict] | None:
    """Rank 0 resolves, reads and checks the checkpoint, then broadcasts it. Collective.

    Returns (path, state), or None when there is nothing to resume from. Raises the same
    CheckpointError on every rank when the checkpoint is unusable. With `--resume auto` (or a
    folder) a damaged newest checkpoint falls back to checkpoint.prev.mgg, with a warning on
    rank 0's stderr.
    """
    out: tuple = (None, None, None)
    if comm.rank == 0:
        try:
            path = resolve_resume(spec, checkpoint_dir)
            if path is not None:
                fallback = spec == "auto" or os.path.isdir(str(spec))
                path, state, warning = read_newest(path, fallback)
                if warning:
                    sys.stderr.write(f"mgg: {warning}\n")
                    sys.stderr.flush()
                check_compatible(state, path, fingerprint=fingerprint, world_size=comm.size,
                                 config=config)
                out = (None, path, state)
        except CheckpointError as e:
            out = ((e.path, e.problem), None, None)
    err, path, state = comm.bcast(out)
    if err is not None:
        raise CheckpointError(*err)
    return None if path is None else (path, state)


class Checkpointer:
    """Periodic checkpoints of a training run: rank 0 writes, every rank agrees on failures."""

    def __init__(self, directory: str, every: int, comm):
        self.directory = os.path.abspath(directory)
        self.every = int(every)
        self.comm = comm
        self.last_path: str | None = None
        if comm.rank == 0:  # what interrupted writes of earlier runs left
            stale = remove_stale_temporaries(os.path.join(self.directory, LAST))
            if stale:
                sys.stderr.write(f"mgg: removed {len(stale)} temporary file(s) that interrupted checkpoint "
                                 f"writes left in {self.directory}\n")
                sys.stderr.flush()

    def due(self, epoch: int) -> bool:
        return self.every > 0 and epoch % self.every == 0

    def save(self, make_state: Callable[[], dict]) -> str:
        """Write `make_state()` (called on rank 0 only). Collective: a write error on rank 0
        (disk full, permissions) raises CheckpointError on every rank."""
        err = None
        if self.comm.rank == 0:
            try:
                self.last_path = write_checkpoint(self.directory, make_state())
            except OSError as e:
                err = f"cannot write into {self.directory}: {e}"
        err = self.comm.bcast(err)
        if err is not None:
            raise CheckpointError(os.path.join(self.directory, LAST), err)
        self.last_path = os.path.join(self.directory, LAST)
        return self.last_path


# -- graceful stop ------------------------------------------------------------------------------
class StopSignal:
    """Context manager: SIGTERM / SIGINT / SIGUSR1 set `requested` (the signal number) instead of
    killing (or raising KeyboardInterrupt, SIGINT's default in Python).

    The training loop sums the flag over ranks at the end of every epoch, so one signalled rank
    stops all of them at the same epoch; a second signal ends the process at once (the
    previous handler runs: a second Ctrl-C raises KeyboardInterrupt). Outside the main thread it
    installs nothing.

    With MGG_SIGUSR2_IS_SIGTERM=1 (set by launch/mpirun.sh) SIGUSR2 counts as SIGTERM: the wrapper
    turns a SIGTERM it gets into a SIGUSR2 for mpirun, because Open MPI's mpirun kills the ranks
    when it gets SIGTERM itself but passes SIGUSR2 on.
    """

    SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
    SIGUSR2_ENV = "MGG_SIGUSR2_IS_SIGTERM"

    def __init__(self) -> None:
        self.requested = 0
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:  # noqa: ARG002
        if self.requested:
            self._restore()
            os.kill(os.getpid(), signum)
            return
        usr2 = getattr(signal, "SIGUSR2", None)
        self.requested = signal.SIGTERM if usr2 is not None and signum == usr2 else signum

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            names = self.SIGNALS + (("SIGUSR2",) if os.environ.get(self.SIGUSR2_ENV) == "1" else ())
            for name in names:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def _restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()

    def __exit__(self, *exc) -> None:
        self._restore()

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""
