"""mgg's modules form one-way layers (docs/architecture.md): read the import graph with `ast`.

Every import counts, at module level or inside a function. The test fails on
  * a module no layer claims (add it to LAYERS),
  * an import from a lower layer to a higher one,
  * a cycle between modules,
  * a module whose import would, through a parent package's `__init__`, run code of a higher
    layer (importing `a.b.c` first runs `a/__init__.py` and `a/b/__init__.py`; their module-level
    imports must stay at or below the importer's layer),
  * a layer entry that is not a folder or top-level module of mgg/, or a folder-level import cycle,
and names the offending edge.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mgg.testing.paths import ROOT

PKG = ROOT / "mgg"

#: lowest first, declared once, one entry per folder of mgg/ (plus the top-level modules of the base
#: and apps layers): a module belongs to the layer of the folder (or top-level module) it lives in.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("mgg", "mgg.atomic", "mgg.version", "mgg.knobs", "mgg.env_vars")),
    ("data", ("mgg.data",)),
    ("runtime", ("mgg.runtime",)),
    ("kernels", ("mgg.kernels",)),
    ("graph", ("mgg.graph",)),
    ("tuning", ("mgg.tuning",)),
    ("nn", ("mgg.nn",)),
    ("sample, embedding", ("mgg.sample", "mgg.embedding")),
    ("apps", ("mgg.apps", "mgg.train", "mgg.prepare", "mgg.serve", "mgg.tune", "mgg.doctor",
              "mgg.build", "mgg.checkpoint", "mgg.testing", "mgg.export", "mgg.predict")),
]


#: cycles that exist today and are being removed elsewhere; each entry must still be a cycle
#: (test_known_cycles_are_still_real), so the list cannot go stale. mgg.train <-> mgg.train_sampled
#: went with the training app's split into mgg/apps/.
KNOWN_CYCLES: set[frozenset[str]] = set()  # none left; an entry needs a reason and the companion test


def module_files() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def folder_of(mod: str) -> str:
    """The folder (or top-level module) of mgg a module lives in: mgg.graph.dist_graph -> mgg.graph."""
    return ".".join(mod.split(".")[:2])


def layer_of(mod: str) -> int | None:
    folder = folder_of(mod)
    for i, (_, prefixes) in enumerate(LAYERS):
        if folder in prefixes:
            return i
    return None


def _target(name: str, mods: dict[str, Path]) -> str | None:
    """The mgg module an imported dotted name lands in (longest existing prefix)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(mod: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported mgg module, line, at module level) for every import statement of `mod`."""
    tree = ast.parse(path.read_text(), str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    for n in tree.body:  # imports under a module-level if/try still run at import time
        if isinstance(n, (ast.If, ast.Try)):
            top_level.update(id(c) for c in ast.walk(n))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            names = [f"{base_name}.{a.name}" if f"{base_name}.{a.name}" in mods else base_name
                     for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] != "mgg":
                continue
            tgt = _target(name, mods)
            if tgt is not None and tgt != mod:
                out.append((tgt, node.lineno, id(node) in top_level))
    return out


def import_graph():
    mods = module_files()
    return mods, {m: imports_of(m, p, mods) for m, p in sorted(mods.items())}


def _where(mods, mod, line) -> str:
    return f"{mods[mod].relative_to(ROOT)}:{line}"


def test_every_module_has_a_layer():
    mods = module_files()
    missing = sorted(m for m in mods if layer_of(m) is None)
    assert not missing, f"modules without a layer (add them to LAYERS in tests/project/test_layers.py): {missing}"


def test_layers_name_folders_once():
    """Each entry is a folder or top-level module of mgg/ (never a module inside a folder), named once."""
    entries = [pre for _, prefixes in LAYERS for pre in prefixes]
    assert len(entries) == len(set(entries)), f"a folder is named by two layers: {entries}"
    mods = module_files()
    bad = [pre for pre in entries if pre not in mods or folder_of(pre) != pre]
    assert not bad, f"layer entries that are not a folder or top-level module of mgg/: {bad}"


def test_no_folder_level_cycle():
    """Folders import each other one way only (within a layer too): the folder graph is acyclic."""
    _, graph = import_graph()
    folders: dict[str, set[str]] = {}
    for mod, edges in graph.items():
        src = folder_of(mod)
        folders.setdefault(src, set()).update(folder_of(t) for t, _, _ in edges if folder_of(t) != src)
    state: dict[str, int] = {}

    def visit(f: str, path: list[str]) -> list[str] | None:
        state[f] = 1
        for t in sorted(folders.get(f, ())):
            if t == "mgg":
                continue  # the package root (mgg/__init__.py) is the base every module starts from
            if state.get(t) == 1:
                return path[path.index(t):] + [f, t] if t in path else path + [f, t]
            if t not in state:
                cyc = visit(t, path + [f])
                if cyc:
                    return cyc
        state[f] = 2
        return None

    for f in sorted(folders):
        if f not in state:
            cyc = visit(f, [])
            assert cyc is None, "folder-level import cycle: " + " -> ".join(cyc)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    mods, graph = import_graph()
    bad = []
    for mod, edges in graph.items():
        lm = layer_of(mod)
        for tgt, line, _ in edges:
            lt = layer_of(tgt)
            if lm is not None and lt is not None and lt > lm:
                bad.append(f"{mod} ({LAYERS[lm][0]}) -> {tgt} ({LAYERS[lt][0]}) at {_where(mods, mod, line)}")
    assert not bad, "imports from a lower layer to a higher one:\n  " + "\n  ".join(bad)


def _adjacency(graph, skip_known: bool = True) -> dict[str, list[str]]:
    adj = {}
    for m, e in graph.items():
        adj[m] = sorted({t for t, _, _ in e
                         if not (skip_known and any({m, t} <= c for c in KNOWN_CYCLES))})
    return adj


def test_known_cycles_are_still_real():
    _, graph = import_graph()
    adj = _adjacency(graph, skip_known=False)
    for c in KNOWN_CYCLES:
        a, b = sorted(c)
        assert b in adj.get(a, ()) and a in adj.get(b, ()), \
            f"{a} <-> {b} is no longer a cycle: remove it from KNOWN_CYCLES in tests/project/test_layers.py"


def test_no_import_cycle():
    mods, graph = import_graph()
    adj = _adjacency(graph)
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in adj.get(m, ()):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state:
                cyc = visit(t)
                if cyc:
                    return cyc
        stack.pop()
        state[m] = 2
        return None

    for m in adj:
        if m not in state:
            cyc = visit(m)
            assert cyc is None, "import cycle: " + " -> ".join(cyc)


def test_parent_package_inits_run_nothing_higher():
    """Importing a.b.c runs a/__init__ and a/b/__init__: their eager imports (transitively) must
    not reach above the importer's layer."""
    mods, graph = import_graph()
    eager = {m: [t for t, _, top in e if top] for m, e in graph.items()}

    def eager_closure(m: str) -> set[str]:
        seen, todo = set(), [m]
        while todo:
            x = todo.pop()
            for t in eager.get(x, ()):
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    bad = []
    for mod, edges in graph.items():
        lm = layer_of(mod)
        for tgt, line, _ in edges:
            parts = tgt.split(".")
            for k in range(1, len(parts)):
                parent = ".".join(parts[:k])
                if parent not in mods or mod == parent or mod.startswith(parent + "."):
                    continue  # already running inside that package
                for x in eager_closure(parent):
                    lx = layer_of(x)
                    if lx is not None and lm is not None and lx > lm and x != mod:
                        bad.append(f"{mod} ({LAYERS[lm][0]}) imports {tgt} at {_where(mods, mod, line)}, "
                                   f"whose package {parent} loads {x} ({LAYERS[lx][0]})")
    assert not bad, "\n  ".join(["package __init__ imports reaching a higher layer:"] + sorted(set(bad)))


@pytest.mark.parametrize("src,expect", [
    ("from ..kernels.gpu import GPUExecutor\n", "mgg.runtime.store (runtime) -> mgg.kernels.gpu (kernels)"),
    ("def f():\n    from ..nn import GCN\n", "mgg.runtime.store (runtime) -> mgg.nn (nn)"),
])
def test_the_checker_catches_a_back_arrow(tmp_path, monkeypatch, src, expect):
    """The checker itself: a function-level or module-level import upward is reported by name."""
    fake = tmp_path / "store.py"
    fake.write_text(src)
    mods = module_files()
    edges = imports_of("mgg.runtime.store", fake, mods)
    lm = layer_of("mgg.runtime.store")
    found = [f"mgg.runtime.store ({LAYERS[lm][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
             for t, _, _ in edges if layer_of(t) > lm]
    assert found == [expect]
