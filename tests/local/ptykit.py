"""Run a command on a real pseudo-terminal and read what a person would see (tests/local only).

The child gets the pty's slave side as stdin, stdout and stderr and as its controlling terminal, so
``isatty()`` is true, the terminal has a size, and a ``^C`` written to the master side reaches it as
SIGINT from the kernel's line discipline, exactly as a key press would.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import termios
import time
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def strip_ansi(text: str) -> str:
    """Text without escape sequences; a carriage return (a redraw of the line) starts a new line."""
    return ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")


class PtyProcess:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, cols: int = 120, rows: int = 30) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: size the terminal, then become the command
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.chdir(cwd)
                os.execve(argv[0], argv, {**env, "TERM": "xterm-256color", "COLUMNS": str(cols),
                                          "LINES": str(rows)})
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.raw = b""
        self.status: int | None = None

    @property
    def text(self) -> str:
        """Everything shown so far, escape sequences removed (redrawn frames follow one another)."""
        return strip_ansi(self.raw.decode(errors="replace"))

    def _read(self, timeout: float) -> int | None:
        """Read what is there: the byte count (0 when nothing came), None once the terminal closed."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return 0
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: every holder of the slave side has exited
            return None
        self.raw += chunk
        return len(chunk) or None

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        deadline = time.time() + timeout
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.text)
            if m:
                return m
            if time.time() > deadline or self._read(min(0.2, max(0.0, deadline - time.time()))) is None:
                m = rx.search(self.text)
                if m:
                    return m
                raise AssertionError(f"{pattern!r} not shown within {timeout}s; the terminal showed:\n{self.text}")

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 60) -> int:
        """Read to the end and reap the child; its exit code (128+N for a signal)."""
        deadline = time.time() + timeout
        while self.status is None:
            alive = self._read(0.2) is not None
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.05):  # what it wrote just before exiting
                    pass
                self.status = os.waitstatus_to_exitcode(st)
                if self.status < 0:
                    self.status = 128 - self.status
            elif time.time() > deadline:
                self.kill()
                raise AssertionError(f"still running after {timeout}s; the terminal showed:\n{self.text}")
            elif not alive:
                time.sleep(0.05)
        os.close(self.fd)
        return self.status

    def kill(self) -> None:
        """Test clean-up: never leave the child behind."""
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
