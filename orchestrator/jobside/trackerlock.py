"""A job's tracker lock (``<runs root>/.orch-locks/<job>.trackers.lock``): the child that marks the job's tracker run
with its end and the wrapper that arranges the next attempt's run take turns.

Why: ``orch requeue`` a second after ``orch cancel`` launched attempt n+1 while the cancel's mark child was still
marking attempt n's end. The child's KILLED landed after the new wrapper had set the MLflow run RUNNING again, and
its ``end`` note overwrote ``trackers.json``: the running job showed a killed run. With the lock, a mark and an
arrange never interleave; a mark that gets the lock after a newer ``attempts/<k>/`` exists is skipped (its end is
no longer the job's), and an arrange that waits for a mark in flight comes after it. Bounded like every orch lock,
and a stopped holder is not waited for (``orchestrator.filelock``): the wrapper then goes on, saying so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from orchestrator import filelock, protocol
from orchestrator.errors import OrchError


class TrackerLockError(OrchError):
    """The tracker lock could not be taken in time, or its holder is stopped, or the file cannot be opened."""


def lock_path(run_dir: Path | str) -> Path:
    """The job's lock file, its directory made (0700) where missing; TrackerLockError when that directory is a
    symlink or a file (it would lead the lock file out of the runs root)."""
    run_dir = Path(run_dir)
    d = run_dir.parent / protocol.LOCKS_DIR
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.mkdir(d, 0o700)
    if d.is_symlink() or not d.is_dir():
        raise TrackerLockError(f"{d} is not a directory of orch's (a symlink or a file)")
    return d / f"{run_dir.name}{protocol.TRACKERS_LOCK_SUFFIX}"


@contextlib.contextmanager
def held(run_dir: Path | str, timeout_s: float) -> Iterator[None]:
    """Hold the job's tracker lock for the block; TrackerLockError (naming the holder) when it cannot be had."""
    with filelock.exclusive(lock_path(run_dir), TrackerLockError, "the tracker lock ", timeout_s=timeout_s):
        yield


def superseded(run_dir: Path | str, attempt: int | None) -> bool:
    """Whether an attempt newer than ``attempt`` (the newest when the end was decided) has been made since."""
    newest = protocol.newest_attempt(run_dir)
    return attempt is not None and newest is not None and newest > attempt
