"""What a training run imports before it has work to do: torch and numpy (and MPI, which the
entry point starts), not the optional or slow packages that only some paths use -- scipy (a
scipy matrix, the CPU's counting transpose, RCM), networkx, aiohttp (the lookup service),
matplotlib (the tuner's plot), PyG, the GPU packages (asked for by the GPU backend) or
torch._dynamo. Each check runs in a fresh interpreter, so no earlier test's import hides one."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mgg.testing.processes import subprocess_env

SLOW_OR_OPTIONAL = ("scipy", "networkx", "aiohttp", "matplotlib", "torch_geometric", "cupy", "nvshmem", "cuda",
                    "pandas", "sympy", "requests", "torch._dynamo")

#: the modules `python -m mgg.train` imports before its dataset loads, and the layers a run uses
RUN_MODULES = ("mgg.train", "mgg.apps.cli", "mgg.apps.full", "mgg.apps.sampled", "mgg.apps.loop",
               "mgg.apps.kernel_prebuild", "mgg.apps.memory_check", "mgg.graph.dist_graph", "mgg.nn", "mgg.data.registry",
               "mgg.data.prepare", "mgg.graph.factory", "mgg.kernels.prebuild")


def _imported_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", probe], env=subprocess_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if m in SLOW_OR_OPTIONAL or any(m.startswith(h + ".") for h in SLOW_OR_OPTIONAL))


@pytest.mark.slow
def test_the_training_run_imports_no_optional_package():
    mods = _imported_after("\n".join(f"import {m}" for m in RUN_MODULES))
    assert "torch" in mods and "numpy" in mods
    assert _heavy(mods) == []


@pytest.mark.slow
def test_the_entry_points_and_the_data_package_import_without_torch():
    """`import mgg.train` (before its flags are parsed) and `import mgg.data` load no torch: the
    data package exports its names lazily."""
    mods = _imported_after("import mgg.train, mgg.data, mgg.build, mgg.serve, mgg.tune")
    assert "torch" not in mods and _heavy(mods) == []
    mods = _imported_after("from mgg.data import load_dataset, from_scipy, Graph\nimport mgg.data as d\n"
                           "assert all(getattr(d, n) is not None for n in d.__all__)")
    assert "scipy" not in mods  # from_scipy imports scipy when it is called
