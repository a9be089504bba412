"""`mpirun -np N python -m mgg.serve --tables tables.json`: the sharded embedding-lookup service.

Every rank loads its rows of every table (from .npy or safetensors files listed in tables.json)
into one symmetric array; rank 0 serves HTTP (default 127.0.0.1:8700) and batches concurrent
requests into collective lookups. See docs/embedding.md for the endpoints.

Binding to a non-loopback host needs both --allow-remote and a token (--auth-token or
MGG_SERVE_TOKEN); otherwise the service refuses to start (exit 2).
"""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", required=True, help="tables.json: [{name, path, mode?, sharding?, key?}, ...]")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8700, help="port (default 8700; 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (needs a token)")
    p.add_argument("--auth-token", default=None, help="require 'Authorization: Bearer TOKEN' (default: $MGG_SERVE_TOKEN)")
    p.add_argument("--max-body-bytes", type=int, default=16 << 20, help="largest accepted request body (default 16 MiB)")
    p.add_argument("--max-batch", type=int, default=64, help="most requests in one batched lookup (default 64)")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="batching window after the first request (default 2 ms)")
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
    for name in ("max_body_bytes", "max_batch"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_wait_ms < 0:
        return _fail("--max-wait-ms must be >= 0")

    from .embedding.io import load_tables_json
    from .embedding.service import EmbeddingService, ServiceConfig
    from .runtime.comm import RankError, world
    from .runtime.backends import make_store

    try:
        specs = load_tables_json(args.tables)  # every rank parses the same file: the same answer
    except ValueError as e:
        return _fail(str(e))
    comm = world()
    snap = args.snapshot_dir or os.path.join(os.path.dirname(os.path.abspath(args.tables)), "snapshots")
    cfg = ServiceConfig(host=args.host, port=args.port, token=token, max_body_bytes=args.max_body_bytes,
                        max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, snapshot_dir=snap)
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
