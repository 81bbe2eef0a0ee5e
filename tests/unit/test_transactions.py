"""core/transactions.py: each transaction, written once, gives the same answer and leaves the same rows on both
executors: SQLAlchemy's (SQLite and PostgreSQL) and the quick path's stdlib sqlite3 with the generated text."""

from __future__ import annotations

import re
import sqlite3
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update

from orchestrator.core.config import sqlite_path
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState, create_attempt, create_job, utcnow
from orchestrator.core.models import Attempt, Event, Job
from orchestrator.core.quickdb import QuickDB, SqliteExecutor
from orchestrator.core.tokens import new_token
from orchestrator.core.transactions import (
    Held,
    Submission,
    check_held,
    claim_pending,
    mark_batch,
    record_submitted,
    renew_claims,
)
from orchestrator.ops import launchclaim, launchrecord
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


# ------------------------------------------------------------------------------------------
# the launch's transactions against lifecycle's movers (the SQLAlchemy path's own functions)
# ------------------------------------------------------------------------------------------
TIMES = {"created_at", "updated_at", "claimed_at", "submitted_at", "started_at", "ended_at", "at"}
PER_ROW = {"id", "job_id", "attempt_id", "name", "run_dir", "token", "command_json", "env_id"}


def _pending(db, cfg, names: list[str]) -> list[Held]:
    """A new job and its pending first attempt per name, as ``orch submit`` writes them before its launch; each to
    be claimed under fence 1."""
    out = []
    for name in names:
        with db.write() as s:
            job = create_job(s, JobState.PENDING, name=name, backend="local", run_dir=str(cfg.home / name),
                             command=["python", "t.py"], resources={}, outputs=[], max_attempts=3)
            a = create_attempt(s, job, 1, new_token())
            s.flush()
            out.append(Held(job.id, a.id, 1))
    return out


def _launch_path(db, held: list[Held]) -> None:
    """Claim, check, mark and record through launch's functions, on lifecycle's movers."""
    ids = [h.attempt_id for h in held]
    assert launchclaim.claim_all(db, ids, reclaim=False) == {i: 1 for i in ids}
    assert launchclaim.check_claims(db, [(i, 1) for i in ids]) == {i: None for i in ids}
    assert launchrecord.mark_batch(db, ids, "B") == set(ids)
    members = [SimpleNamespace(name=f"m{k}", attempt_id=i, overrides={}, fence=1, spec=SimpleNamespace(token=f"t{k}"),
                               moved=[]) for k, i in enumerate(ids)]
    out = launchrecord.record_group(db, None, members, {f"t{k}": f"ext-{k}" for k in range(len(ids))})
    assert {m.outcome.value for m in out.values()} == {"submitted"}


def _times() -> tuple[datetime, datetime, datetime]:
    """Three times in order, after the rows were born, with microseconds (SQLite compares times as text)."""
    t = utcnow().replace(microsecond=250_000) + timedelta(seconds=1)
    return t, t + timedelta(seconds=1), t + timedelta(seconds=2)


T1, T2, T3 = _times()  # for rows made before, in tests that only need an answer


def _transactions_path(run, held: list[Held], times: tuple[datetime, datetime, datetime]) -> None:
    T1, T2, T3 = times
    assert run(lambda ex: claim_pending(ex, held, T1))
    assert run(lambda ex: check_held(ex, held, T2))
    assert run(lambda ex: mark_batch(ex, held, "B"))
    assert run(lambda ex: record_submitted(ex, [Submission(h, f"ext-{k}", {}) for k, h in enumerate(held)], T3))


def _rows(db, held: list[Held]) -> list[dict]:
    """Each job's row, its attempt's and its events' (in order), ids and names left out, times as their order."""
    out = []
    with db.read() as s:
        for h in held:
            job = dict(s.execute(select(Job.__table__).where(Job.id == h.job_id)).mappings().one())
            attempt = dict(s.execute(select(Attempt.__table__).where(Attempt.id == h.attempt_id)).mappings().one())
            events = [dict(r) for r in s.execute(select(Event.__table__).where(Event.job_id == h.job_id)
                                                 .order_by(Event.id)).mappings()]
            # times: in the order the moves took them, each after the row's birth
            assert attempt["created_at"] <= attempt["claimed_at"] <= attempt["submitted_at"]
            assert job["created_at"] <= attempt["submitted_at"] <= job["updated_at"]
            assert [e["at"] for e in events] == sorted(e["at"] for e in events)
            assert events[0]["at"] >= attempt["created_at"]
            out.append({kind: {k: ("<time>" if k in TIMES and v is not None else v)
                               for k, v in row.items() if k not in PER_ROW}
                        for kind, row in (("job", job), ("attempt", attempt))}
                       | {"events": [(e["attempt_id"] is not None, e["from_state"], e["to_state"], e["reason"])
                                     for e in events]})
    return out


@EXECUTORS
def test_a_launch_written_once_leaves_the_rows_lifecycles_movers_leave(db, cfg, sched, executor):
    """Claim, check, mark and record of two new attempts: the same rows, fields and event history as
    ``launchclaim``/``launchrecord`` make through ``lifecycle.move_many``, on each executor and database."""
    theirs, ours = _pending(db, cfg, ["a0", "a1"]), _pending(db, cfg, ["b0", "b1"])
    _launch_path(db, theirs)
    times = _times()
    _transactions_path(_run_on(executor, db, cfg), ours, times)
    assert _rows(db, ours) == _rows(db, theirs)
    with db.read() as s:
        stored = s.execute(select(Attempt.claimed_at, Attempt.submitted_at)
                           .where(Attempt.id.in_([h.attempt_id for h in ours]))).all()
    assert set(stored) == {times[1:]}  # check_held renews the claim


def test_the_sqlite3_executor_stores_times_as_sqlalchemy_stores_them(db, cfg, sched):
    """SQLite compares times as text: a claim written as '12:00:01.25' by one path and '12:00:01.250000' by the
    other would order wrongly against the grace cutoff. Every time column, byte for byte in SQLAlchemy's format."""
    theirs, ours = _pending(db, cfg, ["a0"]), _pending(db, cfg, ["b0"])
    _launch_path(db, theirs)
    _transactions_path(_run_on("sqlite3", db, cfg), ours, _times())
    with sqlite3.connect(sqlite_path(cfg.db_url)) as c:
        texts = [t for row in c.execute("SELECT created_at, claimed_at, submitted_at FROM attempts "
                                        "UNION ALL SELECT at, NULL, NULL FROM events") for t in row if t]
    assert len(texts) >= 10
    assert [t for t in texts if not re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", t)] == []


class _RolledBack(Exception):
    pass


def _answer(run, fn):
    """What ``fn(executor)`` returned, its transaction then rolled back (as a caller does on False)."""
    def answered(ex):
        raise _RolledBack(fn(ex))

    with pytest.raises(_RolledBack) as caught:
        run(answered)
    return caught.value.args[0]


def _set(db, attempt_id: int, **values) -> None:
    with db.write() as s:
        s.execute(update(Attempt).where(Attempt.id == attempt_id).values(**values))


@EXECUTORS
def test_each_batched_move_answers_false_unless_every_row_matched(db, cfg, sched, executor):
    """All or nothing: one row moved by another process (a re-claimer's fence, a cancel) and the function says so,
    for the caller to roll back and decide row by row; each answers True on the rows as they stand."""
    run = _run_on(executor, db, cfg)
    held = _pending(db, cfg, ["x", "y"])
    subs = [Submission(h, f"ext-{k}", {}) for k, h in enumerate(held)]
    _set(db, held[1].attempt_id, state=A.LAUNCHING, fence=1)  # claimed by another launcher first
    assert _answer(run, lambda ex: claim_pending(ex, held, T1)) is False
    assert _answer(run, lambda ex: claim_pending(ex, held[:1], T1)) is True
    _set(db, held[0].attempt_id, state=A.LAUNCHING, fence=1)
    _set(db, held[1].attempt_id, fence=2)  # re-claimed after this launcher's claim expired
    for fn in (lambda ex: check_held(ex, held, T2), lambda ex: record_submitted(ex, subs, T3)):
        assert _answer(run, fn) is False
    assert _answer(run, lambda ex: check_held(ex, held[:1], T2)) is True
    _set(db, held[1].attempt_id, state=A.STOPPING, fence=1)  # a cancel came first
    assert _answer(run, lambda ex: mark_batch(ex, held, "B")) is False
    assert _answer(run, lambda ex: record_submitted(ex, subs, T3)) is False
    assert _answer(run, lambda ex: mark_batch(ex, held[:1], "B")) is True
    with db.write() as s:  # the job moved on (not pending): the attempt alone is not recorded
        s.execute(update(Job).where(Job.id == held[0].job_id).values(state=JobState.CANCELLED))
    assert _answer(run, lambda ex: record_submitted(ex, subs[:1], T3)) is False
