"""`python -m mgg.prepare`: write a graph file once (presets streamed, never whole in memory) and
print what each of P ranks holds. See mgg.apps.prepare_cli."""
from __future__ import annotations

from .apps.prepare_cli import build_parser, main

__all__ = ["main", "build_parser"]

if __name__ == "__main__":
    main()
