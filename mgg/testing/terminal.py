"""A command run as if typed in a terminal, for tests of what Ctrl-C does.

`InTerminal` starts a command in a session of its own whose controlling terminal is a fresh
pseudo-terminal (its standard input); stdout and stderr go to files. `ctrl_c()` types Ctrl-C
into the terminal, so the terminal sends SIGINT to its foreground process group, exactly as a
user's keypress does (not a signal to one chosen process). POSIX only.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["InTerminal"]

# runs in the child: take the terminal on stdin as the controlling terminal of the new session
_TAKE_TTY = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
             "os.execvp(sys.argv[1], sys.argv[1:])")


class InTerminal:
    """Context manager: `cmd` running with a pseudo-terminal as its controlling terminal.

    `out_dir`: where stdout.txt and stderr.txt are written. On leaving, a process still running
    is killed together with the process groups of its children (a launcher's mpirun).
    """

    def __init__(self, cmd: Sequence[str], out_dir: str | os.PathLike, cwd=None, env=None):
        self.cmd, self.cwd, self.env = list(cmd), cwd, env
        self.out_dir = Path(out_dir)
        self.proc: subprocess.Popen | None = None
        self._master = -1

    def __enter__(self) -> "InTerminal":
        import pty

        self._master, slave = pty.openpty()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "stdout.txt", "wb") as out, open(self.out_dir / "stderr.txt", "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", _TAKE_TTY, *self.cmd], stdin=slave, stdout=out,
                                         stderr=err, cwd=self.cwd, env=self.env, start_new_session=True)
        os.close(slave)
        return self

    def ctrl_c(self) -> None:
        """Type Ctrl-C (the terminal's VINTR character) into the terminal."""
        os.write(self._master, b"\x03")

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        return (self.out_dir / "stdout.txt").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.out_dir / "stderr.txt").read_text(errors="replace")

    def _kill(self) -> None:
        p = self.proc
        groups = {p.pid}
        try:  # the children's own process groups (a launcher puts mpirun in one)
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            groups.update(os.getpgid(int(k)) for k in kids)
        except OSError:
            pass
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except OSError:
                pass
        p.wait()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._kill()
        if self._master >= 0:
            os.close(self._master)
            self._master = -1
