"""Every MGG_* environment variable the source reads is listed once, with its default, in
mgg.env_vars, in the table of docs/configuration.md, and (those a run reads) in `mgg.train --help`.

The names are read from the source itself: string literals and keyword arguments in Python
(mgg/, bench/, tests/), every MGG_* word in the shell scripts (launch/, bench/, tests/); names that
the CUDA sources define as macros (`-DMGG_CSR_W=1`) are compile options, not variables.
"""
from __future__ import annotations

import re
from pathlib import Path

from mgg.env_vars import ENV_VARS, SCOPES, run_env_help

from mgg.testing.paths import ROOT
NAME = r"MGG_[A-Z0-9_]*[A-Z0-9]"
PY_LITERAL = re.compile(r"[\"'](" + NAME + r")(?![A-Z0-9_=])")  # "MGG_X" (not "MGG_X=1", a macro define)
PY_KEYWORD = re.compile(r"[(,]\s*(" + NAME + r")=")              # env(MGG_X="5")
SHELL_WORD = re.compile(r"(?<!-D)(?<![A-Za-z0-9_])(" + NAME + r")(?![A-Za-z0-9_])")
DOC_ROW = re.compile(r"^\| `(" + NAME + r")` \| (\w+) \| (.*?) \| (.*) \|$", re.M)


def _files(*patterns: str) -> list[Path]:
    """The source files matching `patterns`, without the recorded runs and without this test (whose
    patterns name made-up variables)."""
    this = Path(__file__).resolve()
    return sorted(p for pat in patterns for p in ROOT.glob(pat)
                  if "bench/results" not in p.as_posix() and p.resolve() != this)


def macro_names() -> set[str]:
    """MGG_* words of the CUDA sources: compile-time macros."""
    return {m for p in _files("mgg/**/*.cu", "mgg/**/*.cuh", "bench/**/*.cu")
            for m in re.findall(NAME, p.read_text(errors="replace"))}


def names_read_by_source() -> dict[str, str]:
    """MGG_* variable name -> the first file (relative) that reads it."""
    found: dict[str, str] = {}
    macros = macro_names()
    for p in _files("mgg/**/*.py", "bench/*.py", "bench/harness/**/*.py", "tests/**/*.py", "examples/**/*.py"):
        text = p.read_text(errors="replace")
        for m in PY_LITERAL.findall(text) + PY_KEYWORD.findall(text):
            if m not in macros:
                found.setdefault(m, p.relative_to(ROOT).as_posix())
    for p in _files("launch/*", "bench/*.sh", "tests/**/*.sh"):
        for m in SHELL_WORD.findall(p.read_text(errors="replace")):
            found.setdefault(m, p.relative_to(ROOT).as_posix())
    return found


def doc_rows() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = DOC_ROW.findall(text)
    assert len(rows) == len({r[0] for r in rows}), "a variable has two rows in docs/configuration.md"
    return {name: (scope, default) for name, scope, default, _ in rows}


def test_the_scan_finds_variables_of_every_kind():
    """The scanner itself: a variable of the package, of a launch script, of a test runner and of a
    benchmark are found, and a CUDA macro is not."""
    found = names_read_by_source()
    assert {"MGG_KERNEL_CACHE", "MGG_ROOT", "MGG_TEST_TIMEOUT", "MGG_BENCH_CACHE", "MGG_SIGUSR2_IS_SIGTERM"} <= set(found)
    assert "MGG_CSR_W" not in found and "MGG_TALL_GEMM_PART" not in found


def test_every_variable_read_is_listed_and_documented():
    found = names_read_by_source()
    listed = {v.name for v in ENV_VARS}
    documented = doc_rows()
    missing = sorted(f"{n} (read in {f})" for n, f in found.items() if n not in listed)
    assert not missing, "MGG_* variables missing from mgg/env_vars.py:\n" + "\n".join(missing)
    undocumented = sorted(f"{n} (read in {f})" for n, f in found.items() if n not in documented)
    assert not undocumented, "MGG_* variables missing from docs/configuration.md:\n" + "\n".join(undocumented)


def test_every_listed_variable_is_read():
    found = names_read_by_source()
    stale = sorted(v.name for v in ENV_VARS if v.name not in found)
    assert not stale, f"listed in mgg/env_vars.py but read nowhere: {stale}"


def test_the_docs_table_matches_the_list():
    rows = doc_rows()
    assert len(ENV_VARS) == len({v.name for v in ENV_VARS}), "a variable is listed twice"
    for v in ENV_VARS:
        assert v.scope in SCOPES
        assert rows.get(v.name) == (v.scope, v.default), \
            f"docs/configuration.md's row of {v.name} is {rows.get(v.name)}, mgg/env_vars.py says {(v.scope, v.default)}"
    assert set(rows) == {v.name for v in ENV_VARS}


def test_train_help_lists_the_variables_a_run_reads():
    from mgg.apps.args import build_parser

    text = build_parser().format_help()
    assert run_env_help().splitlines()[0] in text
    for v in ENV_VARS:
        assert (v.name in text) == (v.scope == "run"), v.name
