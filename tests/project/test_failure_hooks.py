"""The suite's failure hooks (tests/conftest.py, mgg.testing.failure_log) under a real mpirun: with
MGG_TEST_ABORT_ON_FAILURE=1 a test that fails on one rank, while the other rank waits for it in a
collective, ends the job at once (non-zero exit, the reason on stderr) instead of hanging, and
MGG_TEST_FAILURE_LOG still holds that rank's failure."""
import subprocess
import sys
import textwrap

import pytest

from mgg.testing.paths import ROOT
from mgg.testing.processes import MPIRUN, PROCESS_TIMEOUT_S, subprocess_env

pytest.importorskip("mpi4py")

ONE_RANK_FAILS = textwrap.dedent('''
    from mpi4py import MPI


    def test_rank_1_fails_before_a_barrier():
        comm = MPI.COMM_WORLD
        assert comm.Get_rank() != 1, "rank 1 fails here"
        comm.Barrier()  # rank 0 waits here for a rank that never comes
''')


@pytest.mark.needs_mpirun
@pytest.mark.slow
def test_a_failing_rank_aborts_the_job_instead_of_hanging(tmp_path):
    test_file = tmp_path / "test_one_rank_fails.py"
    test_file.write_text(ONE_RANK_FAILS)
    log = tmp_path / "failures"
    cmd = MPIRUN + ["-np", "2", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                    "--rootdir", str(tmp_path), str(test_file)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
                       env=subprocess_env(MGG_TEST_ABORT_ON_FAILURE="1", MGG_TEST_FAILURE_LOG=str(log)))
    assert r.returncode != 0
    assert "failed (call) on rank 1; aborting every rank" in r.stderr
    assert "rank 1 fails here" in (tmp_path / "failures.rank1").read_text()
    assert not (tmp_path / "failures.rank0").exists()


SMALL_SUITE = {
    "tests/test_small.py": '''
        import time


        def test_passes():
            assert True


        def test_fails():
            assert 1 == 2, "a failure the summary must name"


        def test_hangs():
            time.sleep(600)


        def test_after_the_hang_still_runs():
            assert True
    ''',
    "tests/apps/test_small_mpi.py": '''
        import pytest

        pytestmark = pytest.mark.mpi(min_size=2)


        def test_ranks(comm=None):
            from mpi4py import MPI

            assert MPI.COMM_WORLD.Get_size() >= 2
    ''',
    "tests/apps/test_multinode_mpi.py": '''
        import pytest

        pytestmark = pytest.mark.mpi(min_size=2)


        def test_nothing_to_do():
            assert True
    ''',
}


@pytest.mark.needs_mpirun
@pytest.mark.slow
def test_run_all_limits_each_test_and_names_the_failures(tmp_path):
    """tests/run_all.sh over a small suite: a hung test fails at its own time limit (MGG_TEST_TIMEOUT)
    and the run goes on; the summary names each run's result and every failed test; exit 1."""
    pytest.importorskip("pytest_timeout")
    (tmp_path / "tests" / "apps").mkdir(parents=True)
    for name in ("tests/run_all.sh", "tests/conftest.py", "tests/__init__.py", "tests/apps/__init__.py",
                 "pyproject.toml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    for name, text in SMALL_SUITE.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    r = subprocess.run(["bash", str(tmp_path / "tests" / "run_all.sh")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=PROCESS_TIMEOUT_S, env=subprocess_env(MGG_TEST_TIMEOUT="5"))
    assert r.returncode == 1, r.stdout + r.stderr
    summary = r.stdout[r.stdout.index("=== summary ==="):].splitlines()[1:]
    assert summary[:4] == ["mpirun -np 2 -m mpi tests: ok", "mpirun -np 3 -m mpi tests: ok",
                           "mpirun -np 4 -m mpi tests/apps/test_multinode_mpi.py: ok",
                           "single process tests: FAILED (exit 1)"], r.stdout
    assert summary[4:] == ["failed tests:", "  tests/test_small.py::test_fails (call)",
                           "  tests/test_small.py::test_hangs (call)"], r.stdout
    assert "2 failed, 2 passed" in r.stdout and "Timeout" in r.stdout
