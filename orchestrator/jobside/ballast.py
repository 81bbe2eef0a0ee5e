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
import stat
from collections.abc import Callable, Iterable
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


# A batch's pool: one file holding a slot per task of a group launch, where each task's own ballast file
# (one more inode and directory per task) was most of a 1,000-task sweep's filesystem work. A task's wrapper gives
# its slot back first thing when it starts, then makes its attempt dir, records and ballast: on a disk that filled
# while the task was queued, in the room the slot held (hence a slot is a ballast and room for those). The task's
# end (``ending.finish``) gives back the slot of a task that never started; the file goes once no slot holds
# blocks. It needs a filesystem that frees part of a file (hole punching: ext4, xfs, btrfs, tmpfs, Lustre >= 2.14);
# elsewhere each task gets its own ballast at launch, as before.
SLOT_BYTES = BALLAST_BYTES + (64 << 10)  # + the attempt dir, fence.json and command.json
_PUNCH_HOLE_KEEP_SIZE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)


def _punch(fd: int, offset: int, length: int) -> None:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        raise OSError(errno.EOPNOTSUPP, "no fallocate(2) here") from None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if fallocate(fd, _PUNCH_HOLE_KEEP_SIZE, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def reserve_pool(path: Path, slots: Iterable[int], size: int = SLOT_BYTES) -> bool:
    """Create ``path`` holding real blocks for each slot (slot i at ``i * size``), or raise the OSError
    (ENOSPC: the disk is too full for the batch's tasks to record their ends). False, nothing left behind,
    where the filesystem cannot give one slot back alone: then each task needs a ballast of its own."""
    slots = sorted(set(slots))
    if not slots:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        start = prev = slots[0]
        for i in [*slots[1:], None]:  # one fallocate per run of consecutive slots
            if i is not None and i == prev + 1:
                prev = i
                continue
            os.posix_fallocate(fd, start * size, (prev - start + 1) * size)
            if i is not None:
                start = prev = i
        probe = (slots[-1] + 1) * size  # one slot more, given back at once: can this filesystem punch?
        os.posix_fallocate(fd, probe, size)
        _punch(fd, probe, size)
    except OSError as e:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    os.close(fd)
    return True


def release_slot(path: Path, slot: int, size: int = SLOT_BYTES) -> None:
    """Give slot ``slot`` of the pool at ``path`` back (again: nothing happens); the file goes once less than one
    slot's blocks are left in it. Best effort: a pool that is gone, or will not punch, is left as it is, and so
    is anything that is not a pool orch made: a FIFO there hung every reconcile pass in this open, and a hard
    link to another file had that file's bytes zeroed (hostile test)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            return
        _punch(fd, slot * size, size)
        if os.fstat(fd).st_blocks * 512 < size:
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def give_back(run_dir: Path, token: str, task: int) -> None:
    """Task ``task``'s slot in the pool of batch ``token`` beside ``run_dir``, given back; a pool reached through
    a symlink (or a token that is none) is never touched."""
    from orchestrator import protocol

    try:
        pool = protocol.batch_file(run_dir.parent, token, protocol.BATCH_RESERVE)
    except protocol.UnsafePath:
        return
    release_slot(pool, task)


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
