"""Small modules with one job: no Python module of the package, no bench script and no example
is over 500 lines (split it by job instead)."""
from __future__ import annotations

from mgg.testing.paths import ROOT

MAX_LINES = 500


def test_no_module_is_over_500_lines():
    files = [p for folder in ("mgg", "bench", "examples") for p in (ROOT / folder).rglob("*.py")
             if "results" not in p.relative_to(ROOT).parts]
    assert len(files) > 100
    big = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}
