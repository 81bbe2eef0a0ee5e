"""The rows ``orch report`` reads, written once: the SQLAlchemy queries (``report_selects``; the SQLite text they
compile to, for the path without SQLAlchemy, goodputquick, is generated into core/sqlitetext.py by
ops/statements.py), and the plain objects both paths build from the rows (``jobs_from_rows``) for
``goodputview.job_split``. tests/unit/test_goodput_quick.py asserts that both paths give one report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def report_selects(windowed: bool):  # two sqlalchemy Selects, imported lazily
    """(jobs, attempts) of ``goodputview.report``: the jobs created since a cutoff or with an attempt running
    or ended since it (``windowed``), with their sweep's name; and every attempt of those jobs."""
    from sqlalchemy import bindparam, or_, select, union

    from orchestrator.core.models import Attempt, Job, Sweep

    jobs = (select(Job.id, Job.name, Job.backend, Job.run_dir, Job.resources, Job.created_at,
                   Sweep.name.label("sweep"))
            .outerjoin(Sweep, Sweep.id == Job.sweep_id).order_by(Job.id))
    ids = select(Job.id)
    if windowed:
        cutoff = bindparam("cutoff")
        # One list of ids, each part through its own index (ix_jobs_created_at, ix_attempts_ended_at): an OR of
        # the two terms scanned every job (150 ms of 100,000 for 1,000 in the window).
        window = union(select(Job.id).where(Job.created_at >= cutoff),
                       select(Attempt.job_id).where(or_(Attempt.ended_at.is_(None), Attempt.ended_at >= cutoff)))
        jobs, ids = jobs.where(Job.id.in_(window)), ids.where(Job.id.in_(window))
    attempts = (select(Attempt.job_id, Attempt.n, Attempt.token, Attempt.submitted_at, Attempt.started_at,
                       Attempt.ended_at,
                       Attempt.failure_class, Attempt.stop_reason, Attempt.stop_requested_at, Attempt.restarts,
                       Attempt.stale_age_s, Attempt.runs, Attempt.failure_step)
                .where(Attempt.job_id.in_(ids)).order_by(Attempt.job_id, Attempt.n))
    return jobs, attempts


JOB_KEYS = ("id", "name", "backend", "run_dir", "resources", "created_at", "sweep")
ATTEMPT_KEYS = ("job_id", "n", "token", "submitted_at", "started_at", "ended_at", "failure_class", "stop_reason",
                "stop_requested_at", "restarts", "stale_age_s", "runs", "failure_step")


@dataclass
class SweepName:
    name: str


@dataclass
class AttemptRow:
    """The attempt columns ``goodputview.attempt_facts`` reads, as plain values."""

    n: int
    token: str
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    failure_class: str | None
    stop_reason: str | None
    stop_requested_at: datetime | None
    restarts: int
    stale_age_s: float | None = None
    runs: Any = None  # the scheduler's per-run account, as stored (JSON text on the quick path, decoded here)
    failure_step: int | None = None


@dataclass
class JobRow:
    """The job columns ``goodputview.job_split`` reads."""

    name: str
    backend: str
    run_dir: str
    resources: dict[str, Any]
    created_at: datetime
    sweep: SweepName | None
    attempts: list[AttemptRow] = field(default_factory=list)


def _dt(v: Any) -> datetime | None:
    if v is None or isinstance(v, datetime):
        return v
    return datetime.fromisoformat(v)


def jobs_from_rows(job_rows: Any, attempt_rows: Any) -> list[JobRow]:
    """JobRows from the two queries' rows (sqlite3 tuples of text, or SQLAlchemy rows of typed values)."""
    jobs: dict[int, JobRow] = {}
    for r in job_rows:
        j = dict(zip(JOB_KEYS, r, strict=True))
        res = json.loads(j["resources"]) if isinstance(j["resources"], str) else j["resources"]
        jobs[j["id"]] = JobRow(j["name"], j["backend"], j["run_dir"], res if isinstance(res, dict) else {},
                                _dt(j["created_at"]), SweepName(j["sweep"]) if j["sweep"] is not None else None)
    for r in attempt_rows:
        a = dict(zip(ATTEMPT_KEYS, r, strict=True))
        job = jobs.get(a.pop("job_id"))
        if job is not None:
            cls = a["failure_class"]
            if isinstance(a["runs"], str):
                try:
                    a["runs"] = json.loads(a["runs"])
                except ValueError:
                    a["runs"] = None
            job.attempts.append(AttemptRow(**{**a, "failure_class": getattr(cls, "value", cls), **{
                k: _dt(a[k]) for k in ("submitted_at", "started_at", "ended_at", "stop_requested_at")}}))
    return list(jobs.values())
