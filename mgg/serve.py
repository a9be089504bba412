"""`mpirun -np N python -m mgg.serve --tables tables.json`: the sharded embedding-lookup service.

Every rank loads its rows of every table (from .npy or safetensors files listed in tables.json)
into one symmetric array; rank 0 serves HTTP (default 127.0.0.1:8700) and batches concurrent
requests into bounded collective lookup steps. See docs/embedding.md for the endpoints, the
per-request limits, timeouts and the watchdog.

Binding to a non-loopback host needs both --allow-remote and a token (--auth-token or
MGG_SERVE_TOKEN); otherwise the service refuses to start (exit 2).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, fields

from .apps.common_settings import backend_setting
from .apps.flag_spec import REQUIRED, Flag, add_flags, flag_display, parse_settings, setting
from .knobs import SERVICE_DEFAULTS

__all__ = ["main", "build_parser", "ServeSettings", "LIMIT_FIELDS"]


def _limit(name: str, typ: type, text: str):
    """A limit of the service: its flag, default (SERVICE_DEFAULTS) and help; ints must be >= 1,
    floats >= 0 (main checks)."""
    metavar = "N" if typ is int else ("MS" if name.endswith("_ms") else "SECONDS")
    flag = "--" + name.removesuffix("_s").replace("_", "-")
    return setting(SERVICE_DEFAULTS[name], Flag(flag, type=typ, metavar=metavar, help=text + " (default {default})"))


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """The settings of `python -m mgg.serve`, each field with the flag that sets it
    (mgg.apps.flag_spec: the parser is built from these fields); the limits are those of
    mgg.embedding.service.ServiceConfig, with its defaults (mgg.knobs.SERVICE_DEFAULTS)."""

    tables: str = setting(REQUIRED, Flag("--tables", help="tables.json: [{{name, path, mode?, sharding?, key?}}, ...]"))
    host: str = setting(SERVICE_DEFAULTS["host"], Flag("--host", help="address to bind (default {default})"))
    port: int = setting(SERVICE_DEFAULTS["port"], Flag("--port", type=int,
                                                       help="port (default {default}; 0 picks a free one)"))
    allow_remote: bool = setting(False, Flag("--allow-remote", action="store_true",
                                             help="allow a non-loopback --host (needs a token)"))
    auth_token: str | None = setting(None, Flag(
        "--auth-token", help="require 'Authorization: Bearer TOKEN' (default: $MGG_SERVE_TOKEN)"))
    max_body_bytes: int = _limit("max_body_bytes", int, "largest accepted request body (413 above)")
    max_bags: int = _limit("max_bags", int, "most bags in one request (413 above)")
    max_reply_bytes: int = _limit("max_reply_bytes", int,
                                  "largest reply one request may ask for: bags x dim floats (413 above)")
    max_batch: int = _limit("max_batch", int, "most requests in one batched lookup")
    max_wait_ms: float = _limit("max_wait_ms", float, "batching window after the first request")
    max_batch_ids: int = _limit("max_batch_ids", int, "most ids + bags in one lookup pass; a larger request is "
                                "looked up in parts of this size between the others' passes")
    max_connections: int = _limit("max_connections", int,
                                  "most open connections; a new one closes the oldest idle one")
    idle_timeout_s: float = _limit("idle_timeout_s", float,
                                   "seconds before a connection without a complete request is closed")
    io_timeout_s: float = _limit("io_timeout_s", float, "seconds to receive a body or send an answer")
    request_timeout_s: float = _limit("request_timeout_s", float,
                                      "seconds a lookup may wait for its result (504 after)")
    watchdog_timeout_s: float = _limit("watchdog_timeout_s", float, "seconds a collective step may take before the "
                                       "job is aborted with a message (0: off); health fails after a third")
    snapshot_dir: str | None = setting(None, Flag(
        "--snapshot-dir", help="folder for POST /v1/snapshot (default: <tables dir>/snapshots)"))
    backend: str = backend_setting(help="symmetric store backend (default cpu)", choices=("cpu", "gpu"), default="cpu")


#: the ServeSettings fields that are limits of the service (ServiceConfig fields of the same names)
LIMIT_FIELDS = tuple(f.name for f in fields(ServeSettings) if f.name in SERVICE_DEFAULTS and
                     f.name not in ("host", "port"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, ServeSettings)
    return p


def _fail(msg: str) -> int:
    print(f"mgg.serve: error: {msg}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_settings(build_parser(), ServeSettings, argv)
    from .embedding.service import is_loopback

    token = args.auth_token or os.environ.get("MGG_SERVE_TOKEN") or None
    if not is_loopback(args.host):
        if not args.allow_remote:
            return _fail(f"refusing to bind non-loopback host {args.host!r} without --allow-remote (and --auth-token)")
        if not token:
            return _fail(f"refusing to bind non-loopback host {args.host!r} without a token "
                         "(--auth-token TOKEN or MGG_SERVE_TOKEN)")
    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be in [0, 65535], got {args.port}")
    for field in LIMIT_FIELDS:
        v, flag = getattr(args, field), flag_display(ServeSettings, field)
        if isinstance(v, int) and v < 1:
            return _fail(f"{flag} must be >= 1, got {v}")
        if isinstance(v, float) and not v >= 0:
            return _fail(f"{flag} must be >= 0, got {v}")
    for field in ("idle_timeout_s", "io_timeout_s", "request_timeout_s"):
        if not getattr(args, field) > 0:
            return _fail(f"{flag_display(ServeSettings, field)} must be > 0")

    from .embedding.io import load_tables_json
    from .embedding.service import EmbeddingService, ServiceConfig
    from .runtime.comm import RankError, world
    from .graph.backends import make_store

    try:
        specs = load_tables_json(args.tables)  # every rank parses the same file: the same answer
    except ValueError as e:
        return _fail(str(e))
    comm = world()
    snap = args.snapshot_dir or os.path.join(os.path.dirname(os.path.abspath(args.tables)), "snapshots")
    cfg = ServiceConfig(host=args.host, port=args.port, token=token, snapshot_dir=snap,
                        **{field: getattr(args, field) for field in LIMIT_FIELDS})
    try:
        svc = EmbeddingService(specs, comm, cfg, make_store(comm, args.backend))
        svc.bind()
    except (ValueError, TypeError, OSError, RankError) as e:
        return _fail(str(e))
    if comm.rank == 0:
        host, port = svc.address
        print(f"mgg.serve: {len(specs)} tables on {comm.size} ranks; listening on http://{host}:{port}", flush=True)
    rc = svc.run()
    if comm.rank == 0:
        print("mgg.serve: stopped", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
