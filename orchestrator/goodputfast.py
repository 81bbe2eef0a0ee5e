"""``orch report``'s fast path: the same rows through stdlib sqlite3, without importing SQLAlchemy.

As ``orch status`` does (statusview): the queries are written once with the models' columns
(``report_selects``); the fast path runs ``REPORT_SQL``, the text they compile to for SQLite, kept in this
source (tests/unit/test_goodput_fast.py asserts both are equal and that both paths give the same report),
and only while the DB is at ``statusview.STATUS_REVISION``; anything else takes the slow path. Importing
SQLAlchemy alone took ~0.3 s of `orch report`'s 0.5 s on an empty DB.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.config import Config
from orchestrator.statusview import fast_read


def report_selects(windowed: bool):  # noqa: ANN201 - two sqlalchemy Selects, imported lazily
    """(jobs, attempts) of ``goodputview.report``: the jobs created since a cutoff or with an attempt running
    or ended since it (``windowed``), with their sweep's name; and every attempt of those jobs."""
    from sqlalchemy import bindparam, or_, select

    from orchestrator.models import Attempt, Job, Sweep

    jobs = (select(Job.id, Job.name, Job.backend, Job.run_dir, Job.resources, Job.created_at,
                   Sweep.name.label("sweep"))
            .outerjoin(Sweep, Sweep.id == Job.sweep_id).order_by(Job.id))
    ids = select(Job.id)
    if windowed:
        cutoff = bindparam("cutoff")
        active = select(Attempt.job_id).where(or_(Attempt.ended_at.is_(None), Attempt.ended_at >= cutoff))
        where = or_(Job.created_at >= cutoff, Job.id.in_(active))
        jobs, ids = jobs.where(where), ids.where(where)
    attempts = (select(Attempt.job_id, Attempt.n, Attempt.token, Attempt.submitted_at, Attempt.started_at,
                       Attempt.ended_at,
                       Attempt.failure_class, Attempt.stop_reason, Attempt.stop_requested_at, Attempt.restarts,
                       Attempt.stale_age_s)
                .where(Attempt.job_id.in_(ids)).order_by(Attempt.job_id, Attempt.n))
    return jobs, attempts


# What ``report_selects(False)`` / ``report_selects(True)`` compile to for SQLite (bind params: cutoff, cutoff).
# tests/unit/test_goodput_fast.py compiles them and asserts equality: on a change, paste the printed text.
_JOBS = ("SELECT jobs.id, jobs.name, jobs.backend, jobs.run_dir, jobs.resources_json, jobs.created_at, "
         "sweeps.name AS sweep \nFROM jobs LEFT OUTER JOIN sweeps ON sweeps.id = jobs.sweep_id")
_WINDOW = ("jobs.created_at >= ? OR jobs.id IN (SELECT attempts.job_id \nFROM attempts \nWHERE "
           "attempts.ended_at IS NULL OR attempts.ended_at >= ?)")
_ATTEMPTS = ("SELECT attempts.job_id, attempts.n, attempts.token, attempts.submitted_at, attempts.started_at, "
             "attempts.ended_at, attempts.failure_class, attempts.stop_reason, attempts.stop_requested_at, "
             "attempts.restarts, attempts.stale_age_s \n"
             "FROM attempts \nWHERE attempts.job_id IN (SELECT jobs.id \nFROM jobs")
_ATTEMPTS_ORDER = " ORDER BY attempts.job_id, attempts.n"
REPORT_SQL: dict[str, dict[str, str]] = {
    "all": {"jobs": _JOBS + " ORDER BY jobs.id", "attempts": _ATTEMPTS + ")" + _ATTEMPTS_ORDER},
    "window": {"jobs": _JOBS + " \nWHERE " + _WINDOW + " ORDER BY jobs.id",
               "attempts": _ATTEMPTS + " \nWHERE " + _WINDOW + ")" + _ATTEMPTS_ORDER},
}
JOB_KEYS = ("id", "name", "backend", "run_dir", "resources", "created_at", "sweep")
ATTEMPT_KEYS = ("job_id", "n", "token", "submitted_at", "started_at", "ended_at", "failure_class", "stop_reason",
                "stop_requested_at", "restarts", "stale_age_s")


@dataclass
class _Sweep:
    name: str


@dataclass
class FastAttempt:
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


@dataclass
class FastJob:
    """The job columns ``goodputview.job_split`` reads."""

    name: str
    backend: str
    run_dir: str
    resources: dict[str, Any]
    created_at: datetime
    sweep: _Sweep | None
    attempts: list[FastAttempt] = field(default_factory=list)


def _dt(v: Any) -> datetime | None:
    if v is None or isinstance(v, datetime):
        return v
    return datetime.fromisoformat(v)


def jobs_from_rows(job_rows: Any, attempt_rows: Any) -> list[FastJob]:
    """FastJobs from the two queries' rows (sqlite3 tuples of text, or SQLAlchemy rows of typed values)."""
    jobs: dict[int, FastJob] = {}
    for r in job_rows:
        j = dict(zip(JOB_KEYS, r, strict=True))
        res = json.loads(j["resources"]) if isinstance(j["resources"], str) else j["resources"]
        jobs[j["id"]] = FastJob(j["name"], j["backend"], j["run_dir"], res if isinstance(res, dict) else {},
                                _dt(j["created_at"]), _Sweep(j["sweep"]) if j["sweep"] is not None else None)
    for r in attempt_rows:
        a = dict(zip(ATTEMPT_KEYS, r, strict=True))
        job = jobs.get(a.pop("job_id"))
        if job is not None:
            cls = a["failure_class"]
            job.attempts.append(FastAttempt(**{**a, "failure_class": getattr(cls, "value", cls), **{
                k: _dt(a[k]) for k in ("submitted_at", "started_at", "ended_at", "stop_requested_at")}}))
    return list(jobs.values())


def fast_jobs(cfg: Config, since: timedelta | None, now: float) -> list[FastJob] | None:
    """The report's jobs through sqlite3 (``statusview.fast_read``), or None: take the slow path."""
    if not REPORT_SQL:
        return None
    sql = REPORT_SQL["window" if since is not None else "all"]
    params: tuple[Any, ...] = ()
    if since is not None:
        # as SQLAlchemy stores a DateTime in SQLite: always with microseconds, so strings compare as times
        cutoff = (datetime.fromtimestamp(now, UTC).replace(tzinfo=None) - since).strftime("%Y-%m-%d %H:%M:%S.%f")
        params = (cutoff, cutoff)
    return fast_read(cfg, lambda conn: jobs_from_rows(conn.execute(sql["jobs"], params).fetchall(),
                                                      conn.execute(sql["attempts"], params).fetchall()))


def fast_report(cfg: Config, since: timedelta | None, now: float | None = None) -> dict[str, Any] | None:
    """``goodputview.report`` without SQLAlchemy, or None when the slow path must answer."""
    from orchestrator.goodputview import job_split, report_of

    now = time.time() if now is None else now
    jobs = fast_jobs(cfg, since, now)
    if jobs is None:
        return None
    return report_of([job_split(j, now) for j in jobs], since)
