"""``orch cancel``: the job becomes ``cancelled`` at once; its attempt enters the stop sequence.

The attempt goes to ``stopping`` (with ``stop_reason="cancel"`` and its time) and gets SIGTERM
first, so it can checkpoint; the reconciler sends SIGKILL if it is still alive after the grace, and
ends the attempt once the backend says it is gone. While it stops, ``orch requeue`` refuses: a new
attempt would run beside it in the same run dir. A cancel that lands while a launcher is inside its
backend call is honoured by that launcher (``launch.record_submitted``) or, if it died, by the
reconciler, which finds the submission by its token and stops it (issue 9).
"""

from __future__ import annotations

from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, BackendError
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.jobs import attempt_ref, expand_names, get_job
from orchestrator.lifecycle import (
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
