"""core/transactions.py: each transaction, written once, gives the same answer and leaves the same rows on both
executors: SQLAlchemy's (SQLite and PostgreSQL) and the quick path's stdlib sqlite3 with the generated text."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, utcnow
from orchestrator.core.models import Attempt
from orchestrator.core.quickdb import QuickDB, SqliteExecutor
from orchestrator.core.transactions import renew_claims
from orchestrator.ops.statements import SessionExecutor
from orchestrator.ops.submit import SubmitRequest, submit

A = AttemptState
OLD = datetime(2026, 1, 1, 12, 0, 0)
# (state, fence) of four attempts, each claimed by "this launcher" under fence 1
ROWS = {"held": (A.LAUNCHING, 1), "reclaimed": (A.LAUNCHING, 2), "cancelled": (A.STOPPING, 1), "also": (A.LAUNCHING, 1)}


def _attempts(db, cfg) -> dict[str, int]:
    ids = {}
    for name, (state, fence) in ROWS.items():
        submit(db, cfg, SubmitRequest(name=name, command=["python", "t.py"]))
        with db.write() as s:
            a = get_job(s, name).attempts[-1]
            ids[name] = a.id
            s.execute(update(Attempt).where(Attempt.id == a.id).values(state=state, fence=fence, claimed_at=OLD))
    return ids


def _claimed(db, ids: dict[str, int]) -> dict[str, datetime | None]:
    with db.read() as s:
        return {n: s.scalar(select(Attempt.claimed_at).where(Attempt.id == i)) for n, i in ids.items()}


def _run_on(executor: str, db, cfg):
    """A function running ``fn(executor)`` in one write transaction of ``executor``."""
    def on_session(fn):
        with db.write() as s:
            return fn(SessionExecutor(s))

    def on_sqlite3(fn):
        quick = QuickDB.open(cfg)
        assert quick is not None, "the quick path's gate refused the DB the SQLAlchemy path made"
        try:
            with quick.write() as c:
                return fn(SqliteExecutor(c))
        finally:
            quick.close()

    return on_session if executor == "sqlalchemy" else on_sqlite3


# The quick path runs on SQLite only; SQLAlchemy's executor on both databases
EXECUTORS = pytest.mark.parametrize("db_kind, executor", [("sqlite", "sqlalchemy"), ("sqlite", "sqlite3"),
                                                          ("postgres", "sqlalchemy")],
                                    ids=["sqlite-sqlalchemy", "sqlite-sqlite3", "postgres-sqlalchemy"],
                                    indirect=["db_kind"])


@EXECUTORS
def test_renew_claims_renews_exactly_the_claims_still_held(db, cfg, sched, executor):
    ids = _attempts(db, cfg)
    now = utcnow().replace(microsecond=0) + timedelta(seconds=1)
    held = _run_on(executor, db, cfg)(lambda ex: renew_claims(ex, [(i, 1) for i in ids.values()], now))
    assert held == {ids["held"], ids["also"]}
    assert _claimed(db, ids) == {"held": now, "reclaimed": OLD, "cancelled": OLD, "also": now}
