"""The suite's failure hooks (tests/conftest.py) under a real mpirun: with
MGG_TEST_ABORT_ON_FAILURE=1 a test that fails on one rank, while the other rank waits for it in a
collective, ends the job at once (non-zero exit, the reason on stderr) instead of hanging, and
MGG_TEST_FAILURE_LOG still holds that rank's failure."""
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import MPIRUN, ROOT, needs_mpirun, subprocess_env

pytest.importorskip("mpi4py")

ONE_RANK_FAILS = textwrap.dedent('''
    from mpi4py import MPI


    def test_rank_1_fails_before_a_barrier():
        comm = MPI.COMM_WORLD
        assert comm.Get_rank() != 1, "rank 1 fails here"
        comm.Barrier()  # rank 0 waits here for a rank that never comes
''')


@needs_mpirun
@pytest.mark.slow
def test_a_failing_rank_aborts_the_job_instead_of_hanging(tmp_path):
    test_file = tmp_path / "test_one_rank_fails.py"
    test_file.write_text(ONE_RANK_FAILS)
    log = tmp_path / "failures"
    cmd = MPIRUN + ["-np", "2", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                    "--rootdir", str(tmp_path), str(test_file)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=subprocess_env(MGG_TEST_ABORT_ON_FAILURE="1", MGG_TEST_FAILURE_LOG=str(log)))
    assert r.returncode != 0
    assert "failed (call) on rank 1; aborting every rank" in r.stderr
    assert "rank 1 fails here" in (tmp_path / "failures.rank1").read_text()
    assert not (tmp_path / "failures.rank0").exists()
