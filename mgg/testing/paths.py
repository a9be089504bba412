"""Where the repository is, for tests that read its files (README, docs, pyproject, bench) or
launch its code: the folder that holds this `mgg` package.

The test suite imports mgg from the checkout it runs in (pytest puts the repository root first
on sys.path), so ROOT is that checkout."""
from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT"]

#: the repository root (a `Path`): the parent of the `mgg` package folder
ROOT = Path(__file__).resolve().parents[2]
