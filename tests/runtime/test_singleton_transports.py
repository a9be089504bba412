"""mgg.runtime.comm.singleton_transports: a process no MPI launcher started initialises MPI with
Open MPI's self transport only, and leaves no variable behind for the processes it launches."""
import os
import subprocess
import sys

import pytest

from mgg.runtime.comm import SINGLETON_MCA, singleton_transports
from mgg.testing.paths import ROOT


def test_a_singleton_gets_the_self_transport_inside_the_block_only():
    env = {"PATH": "/bin"}
    with singleton_transports(env):
        assert {k: env[k] for k in SINGLETON_MCA} == SINGLETON_MCA
    assert not set(SINGLETON_MCA) & set(env)


def test_the_users_value_wins_and_stays():
    env = {"OMPI_MCA_btl": "self,tcp"}
    with singleton_transports(env):
        assert env["OMPI_MCA_btl"] == "self,tcp" and env["OMPI_MCA_pml"] == "ob1"
    assert env == {"OMPI_MCA_btl": "self,tcp"}


@pytest.mark.parametrize("launcher", [{"OMPI_COMM_WORLD_SIZE": "2"}, {"PMI_RANK": "0"}, {"PMIX_NAMESPACE": "x"}])
def test_a_launched_rank_keeps_the_launchers_transports(launcher):
    env = dict(launcher)
    with singleton_transports(env):
        assert env == launcher


def test_mpi_starts_as_one_rank_and_children_inherit_nothing():
    pytest.importorskip("mpi4py")
    code = ("import os; from mgg.runtime.comm import import_mpi; M = import_mpi(); "
            "print(M.COMM_WORLD.Get_size(), os.environ.get('OMPI_MCA_pml'), os.environ.get('OMPI_MCA_btl'))")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMI", "PMIX")) and k not in SINGLETON_MCA}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["1", "None", "None"]
