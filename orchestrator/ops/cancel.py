"""``orch cancel``: the job becomes ``cancelled`` at once; its attempt enters the stop sequence.

The attempt goes to ``stopping`` (with ``stop_reason="cancel"`` and its time) and gets SIGTERM
first, so it can checkpoint; the reconciler sends SIGKILL if it is still alive after the grace, and
ends the attempt once the backend says it is gone. While it stops, ``orch requeue`` refuses: a new
attempt would run beside it in the same run dir. A cancel that lands while a launcher is inside its
backend call is honoured by that launcher (``launchrecord.record_submitted``) or, if it died, by the
reconciler, which finds the submission by its token and stops it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, BackendError
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import attempt_ref, expand_names, get_job
from orchestrator.core.lifecycle import (
    AttemptState,
    JobState,
    StopReason,
    move_attempt,
    move_job,
    open_attempt,
    set_attempt_fields,
    utcnow,
)

A, J = AttemptState, JobState


def cancel(db: Database, cfg: Config, names: list[str]) -> list[tuple[str, str]]:
    """(name, what happened) per job; a sweep's name stands for its tasks that have not ended.

    Unknown names fail before anything changes. The backend is told once per backend, for every
    attempt together (one scancel for a whole array).
    """
    with db.read() as s:
        jobs = expand_names(s, names, skip=(J.DONE, J.CANCELLED, J.FAILED))
    out: list[tuple[str, str]] = []
    to_stop: dict[str, list[tuple[str, AttemptRef]]] = {}
    for name in jobs:
        with db.write() as s:
            job = get_job(s, name)
            if job.state in (J.DONE, J.CANCELLED, J.FAILED):
                out.append((name, f"not cancelled: job is {job.state.value}"))
                continue
            a = open_attempt(job)
            if a is not None:
                if a.state is A.PENDING:
                    move_attempt(s, a, A.CANCELLED, failure_class="cancelled", detail="cancelled before launch")
                elif a.state is A.STOPPING:
                    set_attempt_fields(s, a, A.STOPPING, stop_reason=StopReason.CANCEL)
                else:
                    if a.state is A.LAUNCHING:
                        revoke_launch(job.run_dir, a.n, a.token)
                    move_attempt(s, a, A.STOPPING, stop_reason=StopReason.CANCEL, stop_requested_at=utcnow())
                if a.external_id:
                    to_stop.setdefault(job.backend, []).append((name, attempt_ref(a, job)))
            move_job(s, job, J.CANCELLED, "orch cancel")
        out.append((name, "cancelled"))
    for backend_name, items in to_stop.items():
        try:
            get_backend(backend_name).cancel([ref for _n, ref in items])
        except BackendError as e:
            told = {n for n, _r in items}
            out = [(n, f"cancelled in orch, but the backend was not told ({e}); stop it by hand")
                   if n in told else (n, w) for n, w in out]
    return out


REVOKED_FENCE = 0  # no launch claim has generation 0 (the first is 1): a wrapper started under any claim runs nothing


def revoke_launch(run_dir: str, n: int, token: str) -> None:
    """A cancel of a launching attempt: its fence file names no claim any more, so a wrapper its launcher starts
    from now on runs nothing (fencing, not a race with the launcher's record: a cancel that came right after the
    launcher's last check saw the program start, and a short one end verified, hostile test). Written inside the
    cancel's write transaction, which the launcher's check and record wait for; best effort: a run dir not made yet,
    or one whose ``attempts/`` is no real directory (never written through), has no wrapper to stop either, and the
    launcher's record still stops what it submitted."""
    from orchestrator import protocol

    try:
        adir = protocol.resolve_inside(Path(run_dir), f"{protocol.ATTEMPTS_DIR}/{int(n)}")
        if not adir.exists() and Path(run_dir).is_dir() and not Path(run_dir).is_symlink():
            # A run dir a group launch made leaves the attempt's records in its batch (launchprep.BatchRecords):
            # the wrapper puts its fence in place only where none is, so this one must be there first.
            for d in (adir.parent, adir):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d, 0o770)
        if adir.is_dir() and not adir.is_symlink():
            protocol.write_fence(adir, token, REVOKED_FENCE)
    except (OSError, protocol.UnsafePath):
        pass
