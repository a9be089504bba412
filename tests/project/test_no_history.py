"""The project describes itself, not its development: no development rounds or issue numbers.

README.md, docs/, mgg/, tests/ and bench/*.py state the design, the knobs and the measured figures
(with the dated bench/results run they come from); a comment states the rule, not the round that
found it. This is the grep `grep -rniE "session [0-9]|issue [0-9]|#[0-9]{1,3}\\b"` over those
paths (plurals included), with no exceptions today: a legitimate match (say a CSS colour) goes
into ALLOWED with its file and the matched line.
"""
from __future__ import annotations

import re
from pathlib import Path

from mgg.testing.paths import ROOT

HISTORY = re.compile(r"sessions? [0-9]|issues? [0-9]|#[0-9]{1,3}\b", re.IGNORECASE)
SUFFIXES = {".md", ".py", ".cu", ".cuh", ".sh", ".toml", ".txt", ".json", ".cfg", ".ini", ".yml", ".yaml"}
#: (path relative to the repository, the whole matching line stripped): matches that are not history
ALLOWED: set[tuple[str, str]] = set()


def scanned_files() -> list[Path]:
    """README.md, docs/, mgg/, tests/, launch/, examples/, .ci/ and bench/ without its dated results."""
    files = [ROOT / "README.md"]
    for folder in ("docs", "mgg", "tests", "launch", "examples", ".ci", "bench"):
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                  and "results" not in p.relative_to(ROOT).parts[:2]]
    files += [p for p in (ROOT / ".ci").glob("*") if p.is_file() and not p.suffix]  # .ci/run
    return [p for p in files if p != Path(__file__).resolve()]


def history_mentions() -> list[str]:
    """'path:line: text' of every line that names a development round or an issue number."""
    found = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line) and (rel, line.strip()) not in ALLOWED:
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_development_history_in_docs_or_code():
    found = history_mentions()
    assert not found, ("state the rule or the figure (with its bench/results run), not the round or "
                       "issue that found it:\n" + "\n".join(found))


def test_the_pattern_catches_what_it_must():
    s, i = "session", "issue"  # the words apart, so this file's own text does not read as history
    for text in (f"({s} 31 c6)", f"{s.title()} 45: the epilogue", f"{i} 17 item 10", "#16's target",
                 f"({i} #5)", f"{s}s 36-39"):
        assert HISTORY.search(text), text
    for text in ("distgraph_session(cfg)", "scope=\"session\"", "issue remote get k", "x[#]"):
        assert not HISTORY.search(text), text
