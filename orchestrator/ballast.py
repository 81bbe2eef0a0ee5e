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


def allocate(path: Path, size: int = BALLAST_BYTES) -> None:
    """Create ``path`` holding ``size`` real blocks, or raise the OSError (ENOSPC on a full disk).

    The launcher calls it before the backend call, so a disk already too full for the ballast is a launch
    that never ran the program (class enospc, uncounted, backed off), not a program that ran with nowhere to
    record its end: with 4 pages free, exit.json no longer fit beside the attempt's other records and the
    attempt ended `unknown`, waiting for a human (found when the launch gained one more record, fence.json).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # real blocks: a sparse file would free nothing
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


class Ballast:
    def __init__(self, path: Path, size: int = BALLAST_BYTES) -> None:
        self.path = path
        self.disk_full = False  # a write hit ENOSPC (the ballast, if held, was then freed)
        try:
            allocate(path, size)  # the launcher's, adopted as it is (fallocate of held blocks adds none)
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
