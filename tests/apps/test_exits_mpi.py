"""A user error under mpirun is printed once: `mpirun -np 2|3 python -m pytest --with-mpi
tests/apps/test_exits_mpi.py`.

mgg.apps.exits.report_user_error: when every rank raised the error, rank 0 prints it and every rank
exits 2; a rank that fails alone prints it with its rank after waiting in vain for the others.
"""
import pytest

from mgg.apps.exits import report_user_error
from mgg.runtime import world

pytestmark = pytest.mark.mpi(min_size=2)


def test_an_error_of_every_rank_is_printed_once_by_rank_0(capsys):
    comm = world()
    control = comm.comm.Dup()
    with pytest.raises(SystemExit) as ei:
        report_user_error(comm, control, "cannot load dataset 'x': no such file")
    assert ei.value.code == 2
    err = capsys.readouterr().err
    expected = "error: cannot load dataset 'x': no such file\n" if comm.rank == 0 else ""
    errs = comm.allgather(err)
    control.Free()
    assert errs[comm.rank] == expected, errs


def test_an_error_of_one_rank_is_printed_by_that_rank(capsys):
    comm = world()
    control = comm.comm.Dup()
    alone = comm.size - 1
    if comm.rank == alone:
        with pytest.raises(SystemExit) as ei:
            report_user_error(comm, control, "disk full", wait_s=0.5)
        assert ei.value.code == 2
    comm.barrier()  # the others arrive only after it gave up waiting
    if comm.rank != alone:
        control.Ibarrier().Wait()  # completes the barrier the lone rank started (and abandoned)
    err = capsys.readouterr().err
    errs = comm.allgather(err)
    assert errs[alone] == f"error (rank {alone} of {comm.size}): disk full\n", errs
    assert all(e == "" for r, e in enumerate(errs) if r != alone), errs
