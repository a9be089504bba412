"""The documentation's links and its bench/results citations hold, both ways.

* Every relative link of README.md, docs/*.md and bench/results/README.md names a file or folder
  that exists.
* Every bench/results path and every run name (`<date>-<machine>-<commit>`) that README.md or a
  docs page mentions exists.
* Every file kept under bench/results is cited: a run's loose file by its path in README.md or a
  docs page, a call's files (`<run>/cN/...`) by the call, a manifest by its run, and every run
  folder has its row in bench/results/README.md.
* A run that code (mgg/, tests/, bench/*.py) cites as `bench/results/<run>` exists or has its row in
  the measurement history, bench/results/README.md.
"""
from __future__ import annotations

import re
from pathlib import Path

from mgg.testing.paths import ROOT

RESULTS = ROOT / "bench" / "results"
HISTORY = RESULTS / "README.md"
RUN = r"\d{4}-\d\d-\d\d-(?:cpu|h\d00x\d)-[0-9a-f]{7}"
CITED_PATH = re.compile(r"bench/results/(" + RUN + r"(?:/[A-Za-z0-9_.:+-]+)*)")
RUN_NAME = re.compile(r"(?<![0-9A-Za-z])(" + RUN + r")(?![0-9A-Za-z])")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def doc_files() -> list[Path]:
    """README.md and every docs page: the pages that state figures."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def cited_paths(text: str) -> set[str]:
    """bench/results paths (relative to bench/results) that `text` mentions, trailing punctuation cut."""
    return {m.group(1).rstrip(".:,") for m in CITED_PATH.finditer(text)}


def test_relative_links_resolve():
    bad = []
    for page in doc_files() + [HISTORY]:
        for target in MD_LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert not bad, "links to missing files:\n" + "\n".join(bad)


def test_cited_results_exist():
    bad = []
    for page in doc_files():
        text = page.read_text()
        for rel in cited_paths(text):
            if not (RESULTS / rel).exists():
                bad.append(f"{page.relative_to(ROOT)}: bench/results/{rel}")
        for run in set(RUN_NAME.findall(text)):
            if not (RESULTS / run).is_dir():
                bad.append(f"{page.relative_to(ROOT)}: run {run}")
    assert not bad, "cited results that do not exist:\n" + "\n".join(sorted(bad))


def test_every_kept_result_is_cited():
    docs_text = "".join(p.read_text() for p in doc_files())
    cited = cited_paths(docs_text)
    history = HISTORY.read_text()
    linked = {t.rstrip("/") for t in MD_LINK.findall(history)}
    uncited = []
    for path in sorted(RESULTS.rglob("*")):
        if not path.is_file() or path == HISTORY:
            continue
        rel = path.relative_to(RESULTS).as_posix()
        parts = rel.split("/")
        run = parts[0]
        if len(parts) == 2 and parts[1] == "manifest.json":
            ok = run in linked
        elif len(parts) >= 3 and re.fullmatch(r"c\d+", parts[1]):
            call = f"{run}/{parts[1]}"
            ok = call in cited and call in linked
        else:
            ok = rel in cited
        if not ok:
            uncited.append(rel)
    assert not uncited, ("files under bench/results that no page cites (cite them, or delete them: "
                         "git history keeps them):\n" + "\n".join(uncited))
    runs = {p.name for p in RESULTS.iterdir() if p.is_dir()}
    assert runs <= linked, f"run folders without a linked row in bench/results/README.md: {sorted(runs - linked)}"


def test_runs_named_in_code_are_kept_or_recorded():
    history_runs = set(RUN_NAME.findall(HISTORY.read_text()))
    sources = [p for d in ("mgg", "tests") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".cu", ".cuh", ".sh")]
    sources += sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "bench").glob("*.sh"))
    bad = []
    for src in sources:
        for run in {rel.split("/")[0] for rel in cited_paths(src.read_text(errors="replace"))}:
            if not (RESULTS / run).is_dir() and run not in history_runs:
                bad.append(f"{src.relative_to(ROOT)}: {run}")
    assert not bad, "runs named in code that are neither kept nor in the measurement history:\n" + "\n".join(bad)


def test_results_stay_small():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(files) <= 100, f"bench/results holds {len(files)} files; keep only the cited runs"


def test_every_named_test_file_exists():
    """A test file named in README, docs, the package or the bench and launch scripts exists: a
    moved test leaves no stale pointer behind."""
    import re

    from mgg.testing.paths import ROOT

    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "mgg").rglob("*.py")),
             *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "bench").glob("*.sh")),
             *sorted((ROOT / "launch").glob("*"))]
    missing = set()
    for path in files:
        if path.is_file():
            for name in re.findall(r"tests/[A-Za-z0-9_/]+\.py", path.read_text(errors="replace")):
                if not (ROOT / name).is_file():
                    missing.add(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, sorted(missing)
