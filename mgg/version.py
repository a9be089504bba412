"""mgg's version string, from the installed distribution's metadata.

`version()` never imports the `mgg` package itself, so it also works when `mgg` was picked up as
a namespace package (a checkout folder named `mgg` on sys.path ahead of the installed package,
where `from mgg import __version__` raises ImportError). Lookup order: the installed `mgg`
distribution (importlib.metadata); else the `version = "..."` line of the pyproject.toml beside
this package (a checkout run through PYTHONPATH, not installed); else ``"0+unknown"``.
This module imports nothing from mgg.
"""
from __future__ import annotations

import functools
import os
import re

__all__ = ["version", "UNKNOWN"]

UNKNOWN = "0+unknown"
_PYPROJECT_VERSION = re.compile(r'^version\s*=\s*"([^"]+)"\s*$', re.MULTILINE)


def _from_pyproject() -> str | None:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    # the [project] table's version (the first `version = "..."` line of the file)
    m = _PYPROJECT_VERSION.search(text)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=1)
def version() -> str:
    """The mgg version, e.g. ``"0.1.0"`` (never raises)."""
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            return dist_version("mgg")
        except PackageNotFoundError:
            pass
    except Exception:  # noqa: BLE001 - a broken metadata folder must not end a finished run
        pass
    return _from_pyproject() or UNKNOWN
