"""pyproject.toml says what the package is: its dependencies agree with each other and with the docs,
every console script and package-data pattern points at something real, and a licence ships."""
import importlib
import re
import sys
import tomllib

import pytest

from mgg.testing.paths import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def _spec(reqs: list[str], name: str) -> str:
    """The version specifier `reqs` give `name` (exactly one entry)."""
    found = [r for r in reqs if re.match(rf"{re.escape(name)}\s*[<>=!~\[]", r) or r == name]
    assert len(found) == 1, (name, reqs)
    return found[0][len(name):].strip()


def _satisfies(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return version in SpecifierSet(spec)


def test_nvshmem_library_pinned_once():
    """The GPU extra installs the NVSHMEM library the test extra builds the kernels against: one range,
    which holds the version docs/kernels.md records."""
    extras = PROJECT["optional-dependencies"]
    gpu, test = _spec(extras["gpu"], "nvidia-nvshmem-cu13"), _spec(extras["test"], "nvidia-nvshmem-cu13")
    assert gpu == test
    recorded = re.search(r"nvidia-nvshmem-cu13 wheel \((\d+\.\d+\.\d+)\)", (ROOT / "docs/kernels.md").read_text())
    assert recorded and _satisfies(recorded.group(1), gpu), (recorded, gpu)


def test_gpu_extra_bounds_hold_what_nvshmem4py_needs():
    """nvshmem4py-cu13 0.4.1 requires cuda.core >= 0.5.0: the gpu extra asks no less."""
    from packaging.specifiers import SpecifierSet

    gpu = PROJECT["optional-dependencies"]["gpu"]
    assert "0.4.1" in SpecifierSet(_spec(gpu, "nvshmem4py-cu13"))
    core = SpecifierSet(_spec(gpu, "cuda-core"))
    assert "0.5.0" in core and "0.4.9" not in core


def test_core_dependencies():
    deps = PROJECT["dependencies"]
    assert not any(d.startswith("networkx") for d in deps)  # the karate graph is embedded
    torch = _spec(deps, "torch")
    for tested in ("2.11.0", "2.13.0"):  # the GPU image's torch and CI's
        assert _satisfies(tested, torch), torch
    assert not _satisfies("2.10.0", torch)  # a lower bound no run tests is not offered


def test_license_file_and_field():
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_package_data_patterns_match_files():
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        folder = ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"{package}: {pattern} matches nothing in {folder}"


@pytest.mark.parametrize("script", sorted(PROJECT["scripts"]))
def test_console_script_resolves(script):
    """Each console script names a module's main(), and that module is the `python -m` command of the
    same name (mgg-train -> mgg.train)."""
    module, func = PROJECT["scripts"][script].split(":")
    assert module == script.replace("-", ".")
    assert callable(getattr(importlib.import_module(module), func))


def test_console_scripts_cover_the_commands():
    assert set(PROJECT["scripts"]) == {"mgg-train", "mgg-prepare", "mgg-serve", "mgg-doctor", "mgg-tune", "mgg-build"}


def test_default_dataset_loads_without_networkx(monkeypatch):
    """The default dataset loads with networkx hidden (a core install need not have it)."""
    import importlib

    import mgg.data.karate as karate

    monkeypatch.setitem(sys.modules, "networkx", None)  # `import networkx` now raises ImportError
    g = importlib.reload(karate).load_karate()
    assert (g.num_nodes, g.num_edges) == (34, 156)
