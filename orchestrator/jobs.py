"""Reading jobs and the one writer of ``jobs.state``: ``transition()``."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from orchestrator.errors import IllegalTransition, JobNotFound
from orchestrator.models import Attempt, Event, Job, utcnow
from orchestrator.states import JobState, can_transition


def get_job(s: Session, name: str) -> Job:
    job = s.scalar(select(Job).where(Job.name == name))
    if job is None:
        raise JobNotFound(f"no job named {name!r}")
    return job


def transition(s: Session, job: Job, dst: JobState, reason: str = "") -> None:
    """Move ``job`` to ``dst`` if the table allows it and nobody moved it first (compare-and-set).

    Raises IllegalTransition for an edge not in ``states.TRANSITIONS`` or when the row's state is no
    longer the one this process read (another reconciler or a user's requeue won the race). The
    event row is written in the same transaction.
    """
    src = JobState(job.state)
    if not can_transition(src, dst):
        raise IllegalTransition(f"job {job.name}: {src.value} -> {dst.value} is not allowed")
    now = utcnow()
    res = s.execute(update(Job).where(Job.id == job.id, Job.state == src.value)
                    .values(state=dst.value, updated_at=now)
                    .execution_options(synchronize_session=False))
    if res.rowcount != 1:
        raise IllegalTransition(f"job {job.name}: state changed under us (expected {src.value})")
    s.add(Event(job_id=job.id, at=now, from_state=src.value, to_state=dst.value, reason=reason[:2000]))
    job.state = dst.value
    job.updated_at = now


def latest_attempt(job: Job) -> Attempt | None:
    return job.attempts[-1] if job.attempts else None


def attempt_view(a: Attempt) -> dict[str, Any]:
    return {
        "n": a.n, "backend": a.backend, "external_id": a.external_id, "state": a.state,
        "backend_state": a.backend_state, "exit_code": a.exit_code,
        "failure_class": a.failure_class, "failure_step": a.failure_step, "detail": a.detail,
        "action": a.action, "overrides": json.loads(a.overrides_json or "{}"), "counted": a.counted,
        "restarts": a.restarts, "token": a.token,
        "submitted_at": _iso(a.submitted_at), "started_at": _iso(a.started_at), "ended_at": _iso(a.ended_at),
    }


def _iso(t: Any) -> str | None:
    return t.isoformat(timespec="seconds") + "Z" if t else None
