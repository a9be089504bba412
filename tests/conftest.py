"""Test-session set-up shared by every test folder."""


def pytest_configure(config):
    """Keep multi-rank test logs text: pytest-mpi's "MPI Information" summary (printed by every
    rank under --with-mpi) writes MPI_Get_library_version() verbatim, and Open MPI's string ends
    in a NUL byte, which makes `grep` call the whole log binary."""
    try:
        with_mpi = config.getoption("--with-mpi")
    except ValueError:  # pytest-mpi not installed
        return
    if not with_mpi:
        return
    from mpi4py import MPI

    library_version = MPI.Get_library_version
    if getattr(library_version, "_mgg_nul_free", False):
        return

    def nul_free() -> str:
        return library_version().replace("\x00", "").rstrip()

    nul_free._mgg_nul_free = True
    MPI.Get_library_version = nul_free
