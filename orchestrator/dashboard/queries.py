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
from orchestrator.views.status import make_row, status_select

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
    """One page of ``orch status``'s rows (the same query, filtered, sorted and limited in SQL), each with the
    causes of its attempts' ends, oldest first."""
    q = _filtered(status_select(), f).order_by(None).order_by(*SORTS[f.sort])
    q = q.limit(f.per).offset((f.page - 1) * f.per)
    with db.read() as s:
        rows = [dict(r._mapping) for r in s.execute(q)]
        total = s.scalar(_filtered(select(func.count()).select_from(Job), f)) or 0
        by_state = s.execute(select(Job.state, func.count()).group_by(Job.state))
        counts = {getattr(st, "value", st): n for st, n in by_state}
        names = [r["name"] for r in rows]
        causes: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        if names:
            for name, n, cls, restarts in s.execute(
                    select(Job.name, Attempt.n, Attempt.failure_class, Attempt.restarts).join(Job)
                    .where(Job.name.in_(names)).order_by(Attempt.job_id, Attempt.n)):
                causes[name].append({"n": n, "class": getattr(cls, "value", cls), "restarts": restarts or 0})
    out = []
    for r in rows:
        row = make_row(r, cfg)  # the heartbeat of a running job, the last step of a finished one
        row["attempt_causes"] = labelled(causes.get(r["name"], []), row["state"])
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
