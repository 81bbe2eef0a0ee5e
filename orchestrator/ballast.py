"""Disk ballast: space the job wrapper sets aside when an attempt starts, for its last writes.

A program that filled the disk failed, and then the wrapper's own ``exit.json`` (and ``--outputs``
marker) failed too: the attempt ended "process gone without an exit record", class ``unknown``, not
``enospc`` with its automatic prune-and-resume. With ballast held, the wrapper frees it on ENOSPC
and writes once more, and records that the disk was full. Stdlib only (the wrapper imports it).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
BALLAST_BYTES = 256 << 10  # an exit.json is ~1 KiB; a done.json ~150 bytes per output file


class Ballast:
    def __init__(self, path: Path, size: int = BALLAST_BYTES) -> None:
        self.path = path
        self.disk_full = False  # a write hit ENOSPC (the ballast, if held, was then freed)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # real blocks: a sparse file would free nothing
            finally:
                os.close(fd)
        except OSError as e:
            self.disk_full = e.errno == errno.ENOSPC  # already full at the start: go on without it
            self.release()

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def write(self, fn: Callable[[], T]) -> T:
        """``fn()``; on ENOSPC free the ballast and call it once more (which may raise again)."""
        try:
            return fn()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            self.disk_full = True
            self.release()
            return fn()
