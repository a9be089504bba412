"""The README's commands run as written (as root too)."""
import os
import re
import shlex
import subprocess

import pytest

from mgg.testing.paths import ROOT

README = (ROOT / "README.md").read_text()


def section_commands(title: str) -> list[str]:
    """The lines of the first ```bash block under the `## title` heading."""
    body = README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", body, re.DOTALL).group(1)
    return [ln for ln in block.splitlines() if ln.strip()]


def test_setup_has_exactly_install_and_test():
    cmds = section_commands("Set up and test")
    assert len(cmds) == 2 and cmds[0].startswith("pip install") and cmds[1] == "bash tests/run_all.sh"


def test_readme_promises_match_the_cli():
    assert "gat" in re.search(r"--model ([a-z|]+)", README).group(1).split("|")
    assert "matplotlib" in README  # the tuner's PNG needs it
    for title in ("Quickstart", "Sampled mini-batch training"):
        first = section_commands(title)[0]
        # root-safe as written: the wrapper adds --allow-run-as-root (a bare mpirun needs it)
        assert first.startswith("launch/mpirun.sh ") or "--allow-run-as-root" in first, first


@pytest.mark.slow
@pytest.mark.parametrize("title", ["Quickstart", "Sampled mini-batch training"])
def test_readme_training_commands_run_as_written(title):
    """The section's first command, with a few epochs instead of the shown number (and
    OMPI_MCA_osc unset: the command itself must be enough)."""
    argv = shlex.split(section_commands(title)[0].split("#")[0])
    if "--epochs" in argv:
        argv[argv.index("--epochs") + 1] = "2"
    else:
        argv += ["--epochs", "2"]
    e = {k: v for k, v in os.environ.items() if k not in ("OMPI_MCA_osc", "PYTHONPATH")}
    e.update(CI="true", OMP_NUM_THREADS="1")
    r = subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "test_acc=" in r.stdout and "Error" not in r.stderr, r.stderr
