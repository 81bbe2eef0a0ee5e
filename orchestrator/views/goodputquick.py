"""``orch report``'s quick path: the same rows through stdlib sqlite3, without importing SQLAlchemy.

As ``orch status`` does (views.status): the queries are written once with the models' columns
(``goodputrows.report_selects``); the quick path runs the text they compile to for SQLite (generated into
core/sqlitetext.py by ops/statements.py; tests/unit/test_goodput_quick.py: both paths give the same report), and only
while the DB is at ``status.SCHEMA_HEAD``; anything else takes the slow path. Importing
SQLAlchemy alone took ~0.3 s of `orch report`'s 0.5 s on an empty DB.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.core.config import Config
from orchestrator.core.goodput import JobSplit
from orchestrator.core.sqlitetext import SQL
from orchestrator.views.goodputrows import JobRow, jobs_from_rows
from orchestrator.views.goodputview import job_split, report_of
from orchestrator.views.status import quick_read


def quick_jobs(cfg: Config, since: timedelta | None, now: float) -> list[JobRow] | None:
    """The report's jobs through sqlite3 (``status.quick_read``), or None: take the slow path."""
    since_ = "_since" if since is not None else ""  # the text of report_selects(windowed), generated
    jobs_sql, attempts_sql = SQL[f"report_jobs{since_}"], SQL[f"report_attempts{since_}"]
    params: dict[str, Any] = {}
    if since is not None:
        # as SQLAlchemy stores a DateTime in SQLite: always with microseconds, so strings compare as times
        cutoff = (datetime.fromtimestamp(now, UTC).replace(tzinfo=None) - since).strftime("%Y-%m-%d %H:%M:%S.%f")
        params = {"cutoff": cutoff}
    return quick_read(cfg, lambda conn: jobs_from_rows(conn.execute(jobs_sql, params).fetchall(),
                                                      conn.execute(attempts_sql, params).fetchall()))


def quick_report(cfg: Config, since: timedelta | None, now: float | None = None) -> dict[str, Any] | None:
    """``goodputview.report`` without SQLAlchemy, or None when the slow path must answer."""
    splits = quick_splits(cfg, since, now)
    return None if splits is None else report_of(splits, since)


def quick_splits(cfg: Config, since: timedelta | None, now: float | None = None) -> list[JobSplit] | None:
    """``goodputview.report_splits`` without SQLAlchemy, or None when the slow path must answer."""
    now = time.time() if now is None else now
    jobs = quick_jobs(cfg, since, now)
    return None if jobs is None else [job_split(j, now) for j in jobs]
