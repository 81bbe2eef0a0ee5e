"""Reading jobs: lookup by name, and the JSON view of an attempt (``orch show``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.errors import JobNotFound
from orchestrator.models import Attempt, Job


def get_job(s: Session, name: str) -> Job:
    job = s.scalar(select(Job).where(Job.name == name))
    if job is None:
        raise JobNotFound(f"no job named {name!r}")
    return job


def attempt_view(a: Attempt) -> dict[str, Any]:
    return {
        "n": a.n, "backend": a.backend, "external_id": a.external_id, "state": a.state.value,
        "backend_state": a.backend_state, "exit_code": a.exit_code,
        "failure_class": a.failure_class.value if a.failure_class else None, "failure_step": a.failure_step,
        "detail": a.detail, "action": a.action.as_dict() if a.action else None, "overrides": a.overrides or {},
        "counted": a.counted, "restarts": a.restarts, "token": a.token,
        "stop_reason": a.stop_reason, "stop_requested_at": _iso(a.stop_requested_at),
        "submitted_at": _iso(a.submitted_at), "started_at": _iso(a.started_at), "ended_at": _iso(a.ended_at),
    }


def _iso(t: Any) -> str | None:
    return t.isoformat(timespec="seconds") + "Z" if t else None
