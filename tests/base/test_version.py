"""mgg's version comes from the installed distribution (mgg/version.py), so nothing that runs
after training needs `from mgg import __version__`, which fails when a checkout folder named
`mgg` is picked up as a namespace package."""
import json
import os
import re
import subprocess
import sys

import pytest

from mgg.version import version
from mgg.testing.paths import ROOT


# A folder named `mgg` with no __init__.py in the working directory makes `import mgg` a namespace
# package (as a clone named `mgg`, run from its parent, does); this tree's mgg/ is then added to the
# namespace path, so the submodules come from here but mgg/__init__.py never runs.
NAMESPACE_BOOT = """
import runpy, sys
import mgg
assert getattr(mgg, "__file__", None) is None, mgg  # a namespace package
try:
    from mgg import __version__  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("expected the namespace package to lack __version__")
mgg.__path__.append({pkg!r})
sys.argv = [{mod!r}] + sys.argv[1:]
runpy.run_module({mod!r}, run_name="__main__", alter_sys=True)
"""


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE).group(1)


def test_version_matches_pyproject():
    # the installed distribution was built from this pyproject (or, uninstalled, read from it)
    assert version() == _pyproject_version()
    import mgg

    assert mgg.__version__ == version()


def _namespace_run(tmp_path, mod, *args, timeout=180):
    work = tmp_path / "parent"
    (work / "mgg").mkdir(parents=True)  # the clone folder, as seen from its parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMPI_MCA_osc="^ucx", CI="true", OMP_NUM_THREADS="1")
    boot = NAMESPACE_BOOT.format(pkg=str(ROOT / "mgg"), mod=mod)
    return subprocess.run([sys.executable, "-c", boot, *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_train_metrics_and_checkpoint_under_namespace_package(tmp_path):
    metrics, ckpt = tmp_path / "m.json", tmp_path / "ck"
    r = _namespace_run(tmp_path, "mgg.train", "--epochs", "2", "--backend", "cpu",
                       "--metrics-json", str(metrics), "--checkpoint-dir", str(ckpt))
    assert r.returncode == 0, r.stderr
    assert "ImportError" not in r.stderr
    assert json.loads(metrics.read_text())["version"] == _pyproject_version()
    assert (ckpt / "checkpoint.mgg").exists()


@pytest.mark.slow
def test_doctor_under_namespace_package(tmp_path):
    out = tmp_path / "doctor.json"
    r = _namespace_run(tmp_path, "mgg.doctor", "--backend", "cpu", "--json", str(out))
    assert "ImportError" not in r.stderr, r.stderr
    assert out.exists(), r.stderr
    doc = json.loads(out.read_text())
    assert _pyproject_version() in json.dumps(doc)
