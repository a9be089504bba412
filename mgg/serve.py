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

__all__ = ["main", "build_parser"]


#: flag -> (ServiceConfig field, type, help); the defaults are ServiceConfig's
LIMIT_FLAGS = {
    "--max-body-bytes": ("max_body_bytes", int, "largest accepted request body (413 above)"),
    "--max-bags": ("max_bags", int, "most bags in one request (413 above)"),
    "--max-reply-bytes": ("max_reply_bytes", int, "largest reply one request may ask for: bags x dim floats (413 above)"),
    "--max-batch": ("max_batch", int, "most requests in one batched lookup"),
    "--max-wait-ms": ("max_wait_ms", float, "batching window after the first request"),
    "--max-batch-ids": ("max_batch_ids", int, "most ids + bags in one lookup pass; a larger request is looked up in "
                                              "parts of this size between the others' passes"),
    "--max-connections": ("max_connections", int, "most open connections; a new one closes the oldest idle one"),
    "--idle-timeout": ("idle_timeout_s", float, "seconds before a connection without a complete request is closed"),
    "--io-timeout": ("io_timeout_s", float, "seconds to receive a body or send an answer"),
    "--request-timeout": ("request_timeout_s", float, "seconds a lookup may wait for its result (504 after)"),
    "--watchdog-timeout": ("watchdog_timeout_s", float, "seconds a collective step may take before the job is "
                                                        "aborted with a message (0: off); health fails after a third"),
}


def build_parser() -> argparse.ArgumentParser:
    from .embedding.service import ServiceConfig

    d = ServiceConfig()
    p = argparse.ArgumentParser(prog="python -m mgg.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", required=True, help="tables.json: [{name, path, mode?, sharding?, key?}, ...]")
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host})")
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port}; 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (needs a token)")
    p.add_argument("--auth-token", default=None, help="require 'Authorization: Bearer TOKEN' (default: $MGG_SERVE_TOKEN)")
    for flag, (field, typ, text) in LIMIT_FLAGS.items():
        metavar = "N" if typ is int else ("MS" if field.endswith("_ms") else "SECONDS")
        p.add_argument(flag, type=typ, default=getattr(d, field), dest=field, metavar=metavar,
                       help=f"{text} (default {getattr(d, field)})")
    p.add_argument("--snapshot-dir", default=None, help="folder for POST /v1/snapshot (default: <tables dir>/snapshots)")
    p.add_argument("--backend", choices=("cpu", "gpu"), default="cpu", help="symmetric store backend (default cpu)")
    return p


def _fail(msg: str) -> int:
    print(f"mgg.serve: error: {msg}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    for flag, (field, typ, _) in LIMIT_FLAGS.items():
        v = getattr(args, field)
        if typ is int and v < 1:
            return _fail(f"{flag} must be >= 1, got {v}")
        if typ is float and not v >= 0:
            return _fail(f"{flag} must be >= 0, got {v}")
    for flag in ("--idle-timeout", "--io-timeout", "--request-timeout"):
        if not getattr(args, LIMIT_FLAGS[flag][0]) > 0:
            return _fail(f"{flag} must be > 0")

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
                        **{field: getattr(args, field) for field, _, _ in LIMIT_FLAGS.values()})
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
