"""The jobs page's query: one page of jobs with their latest attempt, filtered and sorted in SQL, and the count of
each state; the causes of each shown job's attempts in one more query. Its cost grows with the page, not with the
history: a page of 50 reads 50 jobs' rows and run dirs, whatever the table holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.lifecycle import JobState
from orchestrator.core.models import Attempt, Job, Sweep
from orchestrator.core.states import utcnow
from orchestrator.views.status import make_row

PER_PAGE = 50
MAX_PER_PAGE = 500
SORTS = {"new": (Job.id.desc(),), "old": (Job.id.asc(),), "name": (Job.name.asc(), Job.id.asc()),
         "state": (Job.state.asc(), Job.id.desc())}
STATES = tuple(s.value for s in JobState)


@dataclass(frozen=True)
class Filters:
    """What the jobs page shows, as its URL says it (every field validated before any query)."""

    state: str | None = None
    name: str | None = None  # a part of the name
    backend: str | None = None
    sweep: str | None = None
    since: timedelta | None = None  # submitted within
    sort: str = "new"
    page: int = 1
    per: int = PER_PAGE


@dataclass
class JobsPage:
    rows: list[dict[str, Any]]
    total: int  # jobs that pass the filters
    state_counts: dict[str, int] = field(default_factory=dict)  # every job, by state (the chips)


def _filtered(q: Any, f: Filters) -> Any:
    if f.state is not None:
        q = q.where(Job.state == JobState(f.state))
    if f.name:
        q = q.where(Job.name.contains(f.name, autoescape=True))
    if f.backend:
        q = q.where(Job.backend == f.backend)
    if f.sweep:
        q = q.where(Job.sweep_id.in_(select(Sweep.id).where(Sweep.name == f.sweep)))
    if f.since is not None:
        q = q.where(Job.created_at >= utcnow() - f.since)
    return q


def jobs_page(db: Database, cfg: Config, f: Filters) -> JobsPage:
    """One page of ``orch status``'s rows, each with the causes of its attempts' ends, oldest first.

    The page's jobs are chosen on the jobs table alone (filtered, sorted and limited in SQL); only then are their
    attempts read, by job id. ``orch status``'s query joins every job's latest attempt through a GROUP BY over the
    whole attempts table: at 3,000 jobs a filtered page took 12x its 300-job time (bench_dashboard)."""
    q = (select(Job.id, Job.name, Job.state, Job.backend, Job.run_dir, Job.task_index, Sweep.name.label("sweep"))
         .outerjoin(Sweep, Sweep.id == Job.sweep_id))
    q = _filtered(q, f).order_by(*SORTS[f.sort]).limit(f.per).offset((f.page - 1) * f.per)
    with db.read() as s:
        jobs = [dict(r._mapping) for r in s.execute(q)]
        total = s.scalar(_filtered(select(func.count()).select_from(Job), f)) or 0
        by_state = s.execute(select(Job.state, func.count()).group_by(Job.state))
        counts = {getattr(st, "value", st): n for st, n in by_state}
        attempts: dict[int, list[Any]] = {j["id"]: [] for j in jobs}
        if jobs:
            for a in s.execute(select(Attempt.job_id, Attempt.n, Attempt.failure_class, Attempt.restarts,
                                      Attempt.external_id, Attempt.state)
                               .where(Attempt.job_id.in_(list(attempts))).order_by(Attempt.job_id, Attempt.n)):
                attempts[a.job_id].append(a)
    out = []
    for j in jobs:
        mine = attempts[j["id"]]
        latest = mine[-1] if mine else None
        row = make_row({**j, "count": len(mine), "n": latest.n if latest else None,
                        "external_id": latest.external_id if latest else None,
                        "failure_class": latest.failure_class if latest else None,
                        "restarts": latest.restarts if latest else 0,
                        "attempt_state": latest.state if latest else None}, cfg)
        row["attempt_causes"] = labelled([{"n": a.n, "class": getattr(a.failure_class, "value", a.failure_class),
                                           "restarts": a.restarts or 0} for a in mine], row["state"])
        out.append(row)
    return JobsPage(out, total, {st: counts.get(st, 0) for st in STATES})


def labelled(causes: list[dict[str, Any]], job_state: str) -> list[dict[str, Any]]:
    """Each attempt's chip: the class its end got; the last attempt of a live job ``running``, of a verified one
    ``ok``; ``-`` for an end without a class (cancelled before it ran, say)."""
    for i, a in enumerate(causes):
        last = i == len(causes) - 1
        a["label"] = a["class"] or ("running" if last and job_state in ("running", "submitted", "pending") else
                                    "ok" if last and job_state == "done_marker_verified" else "-")
    return causes
