"""Reading jobs: lookup by name, and the JSON view of an attempt (``orch show``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.backends.base import AttemptRef
from orchestrator.core.db import lock_names
from orchestrator.core.lifecycle import JobState
from orchestrator.core.models import Attempt, Job, Sweep
from orchestrator.errors import JobNotFound


def get_job(s: Session, name: str) -> Job:
    job = s.scalar(select(Job).where(Job.name == name))
    if job is None:
        raise JobNotFound(f"no job named {name!r}")
    return job


def names_taken(s: Session, names: Iterable[str]) -> set[str]:
    """Which of ``names`` a job or a sweep has already (one namespace), read under the names lock:
    call it in the write transaction that then inserts the names."""
    names = list(names)
    lock_names(s)
    taken = set(s.scalars(select(Job.name).where(Job.name.in_(names))))
    return taken | set(s.scalars(select(Sweep.name).where(Sweep.name.in_(names))))


def attempt_ref(a: Attempt, job: Job, external_id: str | None = None) -> AttemptRef:
    """How the backend knows this attempt (an array task also by its batch token and index)."""
    return AttemptRef(external_id if external_id is not None else a.external_id, a.token, Path(job.run_dir), a.n,
                      batch=a.batch_token, task=job.task_index)


def attempt_view(a: Attempt) -> dict[str, Any]:
    return {
        "n": a.n, "backend": a.backend, "external_id": a.external_id, "state": a.state.value,
        "backend_state": a.backend_state, "exit_code": a.exit_code,
        "failure_class": a.failure_class.value if a.failure_class else None, "failure_step": a.failure_step,
        "detail": a.detail, "action": a.action.as_dict() if a.action else None, "overrides": a.overrides or {},
        "counted": a.counted, "restarts": a.restarts, "token": a.token,
        "world_size": a.world_size, "nodes": a.nodes,
        # the hang stop's record (observe): the rank furthest behind (None: a one-process job), its step, its age
        "stale_rank": a.stale_rank, "stale_step": a.stale_step, "stale_age_s": a.stale_age_s,
        "stop_reason": a.stop_reason, "stop_requested_at": _iso(a.stop_requested_at),
        "submitted_at": _iso(a.submitted_at), "started_at": _iso(a.started_at), "ended_at": _iso(a.ended_at),
    }


def _iso(t: Any) -> str | None:
    return t.isoformat(timespec="seconds") + "Z" if t else None


def expand_names(s: Session, names: list[str], skip: tuple[JobState, ...] = ()) -> list[str]:
    """Job names as given, with a sweep's name replaced by its tasks (those not in ``skip``).

    Raises JobNotFound for a name that is neither a job nor a sweep.
    """
    out: list[str] = []
    for n in names:
        sweep = s.scalar(select(Sweep).where(Sweep.name == n))
        if sweep is None:
            get_job(s, n)
            out.append(n)
        else:
            out += [t.name for t in sweep.tasks if t.state not in skip]
    return list(dict.fromkeys(out))

