"""core/transactions.py: each transaction, written once, gives the same answer and leaves the same rows on both
executors: SQLAlchemy's (SQLite and PostgreSQL) and the quick path's stdlib sqlite3 with the generated text."""

from __future__ import annotations

import re
import sqlite3
import threading
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from orchkit import wait_for
from sqlalchemy import select, text, update

from orchestrator.core.config import sqlite_path
from orchestrator.core.environments import environment_record
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState, Move, create_attempt, create_job, move_many, utcnow
from orchestrator.core.models import Attempt, Environment, Event, Job, Sweep
from orchestrator.core.quickdb import QuickDB, SqliteExecutor
from orchestrator.core.tokens import new_token
from orchestrator.core.transactions import (
    Births,
    Held,
    Newborn,
    Submission,
    born_pending,
    check_held,
    claim_pending,
    environment_id,
    mark_batch,
    new_sweep,
    record_submitted,
    renew_claims,
)
from orchestrator.errors import IllegalTransition
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


def _movers_path(db, held: list[Held]) -> None:
    """The oracle: claim, check, mark and record as ``lifecycle.move_many`` writes them, from Moves built here."""
    def moved(build) -> None:
        with db.write() as s, s.no_autoflush:
            rows = launchclaim.preload(s, [h.attempt_id for h in held], jobs=True)
            move_many(s, [m for k, h in enumerate(held) for m in build(k, rows[h.attempt_id], rows, utcnow())])

    moved(lambda k, a, rows, now: [Move(a, A.PENDING, A.LAUNCHING, {"claimed_at": now, "fence": 1}, fenced=True,
                                        fence=0, why="claimed (fence 1)")])
    moved(lambda k, a, rows, now: [Move(a, A.LAUNCHING, None, {"claimed_at": now, "launched_fence": 1}, fenced=True,
                                        fence=1)])
    moved(lambda k, a, rows, now: [Move(a, A.LAUNCHING, None, {"batch_token": "B"})])
    moved(lambda k, a, rows, now: [
        Move(a, A.LAUNCHING, A.SUBMITTED, {"external_id": f"ext-{k}", "submitted_at": now, "overrides": {}},
             fenced=True, fence=1, why=f"submitted as ext-{k}"),
        Move(rows["job", a.job_id], JobState.PENDING, JobState.SUBMITTED, why=f"attempt 1 submitted as ext-{k}")])


def _launch_path(db, held: list[Held]) -> None:
    """Claim, check, mark and record through launch's functions (the SQLAlchemy path)."""
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
    ``lifecycle.move_many`` writes for the same moves, on each executor and database; and launch's own functions
    (which run the same transactions) leave them too."""
    oracle, ours, launched = (_pending(db, cfg, [f"{p}0", f"{p}1"]) for p in "abc")
    _movers_path(db, oracle)
    times = _times()
    _transactions_path(_run_on(executor, db, cfg), ours, times)
    _launch_path(db, launched)
    assert _rows(db, ours) == _rows(db, oracle)
    assert _rows(db, launched) == _rows(db, oracle)
    with db.read() as s:
        stored = s.execute(select(Attempt.claimed_at, Attempt.submitted_at)
                           .where(Attempt.id.in_([h.attempt_id for h in ours]))).all()
    assert set(stored) == {times[1:]}  # check_held renews the claim


def test_the_sqlite3_executor_stores_times_as_sqlalchemy_stores_them(db, cfg, sched):
    """SQLite compares times as text: a claim written as '12:00:01.25' by one path and '12:00:01.250000' by the
    other would order wrongly against the grace cutoff. Every time column, byte for byte in SQLAlchemy's format."""
    theirs, ours = _pending(db, cfg, ["a0"]), _pending(db, cfg, ["b0"])
    _movers_path(db, theirs)
    t1, t2, t3 = _times()
    _transactions_path(_run_on("sqlite3", db, cfg), ours, (t1, t2.replace(microsecond=0), t3))  # a whole second too
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


# ------------------------------------------------------------------------------------------
# launch's functions on the shared transactions: the guards around them
# ------------------------------------------------------------------------------------------
def _changed_after_the_read(monkeypatch, change) -> None:
    """``launchclaim.preload`` that runs ``change(s)`` in the caller's transaction right after its first read: a row
    moved between the read and the batched write (what the write lock or FOR UPDATE rules out, if either fails)."""
    real, first = launchclaim.preload, [True]

    def racing(s, ids, jobs=False):
        rows = real(s, ids, jobs)
        if first[0]:
            first[0] = False
            change(s)
        return rows

    monkeypatch.setattr(launchclaim, "preload", racing)
    monkeypatch.setattr(launchrecord, "preload", racing)


def test_claim_all_reports_a_claim_only_where_the_row_holds_it(db, cfg, sched, monkeypatch):
    held = _pending(db, cfg, ["p", "q"])
    _changed_after_the_read(monkeypatch, lambda s: s.execute(  # the table: the session's rows stay as read
        update(Attempt.__table__).where(Attempt.id == held[1].attempt_id).values(state=A.CANCELLED)))
    fences = launchclaim.claim_all(db, [h.attempt_id for h in held], reclaim=False)
    with db.read() as s:
        for attempt_id, fence in fences.items():
            a = s.get(Attempt, attempt_id)
            assert (a.state, a.fence) == (A.LAUNCHING, fence)
        claims = s.scalars(select(Event.attempt_id).where(Event.to_state == "launching")).all()
    assert sorted(claims) == sorted(fences)  # one claim event per claim, none for a batch rolled back


def test_check_claims_refuses_a_batch_in_which_a_claim_moved(db, cfg, sched, monkeypatch):
    held = _pending(db, cfg, ["p", "q"])
    launchclaim.claim_all(db, [h.attempt_id for h in held], reclaim=False)
    before = _claimed(db, {"p": held[0].attempt_id, "q": held[1].attempt_id})
    _changed_after_the_read(monkeypatch, lambda s: s.execute(
        update(Attempt.__table__).where(Attempt.id == held[1].attempt_id).values(fence=2)))
    with pytest.raises(IllegalTransition):
        launchclaim.check_claims(db, [(h.attempt_id, 1) for h in held])
    assert _claimed(db, {"p": held[0].attempt_id, "q": held[1].attempt_id}) == before  # rolled back whole


def test_mark_batch_refuses_a_batch_in_which_an_attempt_moved(db, cfg, sched, monkeypatch):
    held = _pending(db, cfg, ["p", "q"])
    launchclaim.claim_all(db, [h.attempt_id for h in held], reclaim=False)
    _changed_after_the_read(monkeypatch, lambda s: s.execute(
        update(Attempt.__table__).where(Attempt.id == held[1].attempt_id).values(state=A.STOPPING)))
    with pytest.raises(IllegalTransition):
        launchrecord.mark_batch(db, [h.attempt_id for h in held], "B")
    with db.read() as s:
        assert {s.get(Attempt, h.attempt_id).batch_token for h in held} == {None}  # rolled back whole


def test_record_group_refuses_a_batch_in_which_a_claim_moved(db, cfg, sched, monkeypatch):
    held = _pending(db, cfg, ["p", "q"])
    launchclaim.claim_all(db, [h.attempt_id for h in held], reclaim=False)
    members = [SimpleNamespace(name=n, attempt_id=h.attempt_id, overrides={}, fence=1, spec=SimpleNamespace(token=n),
                               moved=[]) for n, h in zip("pq", held, strict=True)]
    _changed_after_the_read(monkeypatch, lambda s: s.execute(
        update(Attempt.__table__).where(Attempt.id == held[1].attempt_id).values(fence=2)))
    with pytest.raises(IllegalTransition):
        launchrecord.record_group(db, None, members, {"p": "ext-p", "q": "ext-q"})
    with db.read() as s:
        assert {s.get(Attempt, h.attempt_id).state for h in held} == {A.LAUNCHING}  # rolled back whole


def test_record_group_records_an_attempt_whose_job_moved_on_without_moving_the_job(db, cfg, sched):
    held = _pending(db, cfg, ["p", "q"])
    launchclaim.claim_all(db, [h.attempt_id for h in held], reclaim=False)
    with db.write() as s:
        s.execute(update(Job).where(Job.id == held[1].job_id).values(state=JobState.CANCELLED))
    members = [SimpleNamespace(name=n, attempt_id=h.attempt_id, overrides={}, fence=1, spec=SimpleNamespace(token=n),
                               moved=[]) for n, h in zip("pq", held, strict=True)]
    out = launchrecord.record_group(db, None, members, {"p": "ext-p", "q": "ext-q"})
    assert {n: r.outcome.value for n, r in out.items()} == {"p": "submitted", "q": "submitted"}
    with db.read() as s:
        assert [s.get(Job, h.job_id).state for h in held] == [JobState.SUBMITTED, JobState.CANCELLED]
        assert [s.get(Attempt, h.attempt_id).external_id for h in held] == ["ext-p", "ext-q"]


def test_a_record_without_overrides_keeps_the_attempts_own(db, cfg, sched):
    """The reconciler records an id it found by token (no overrides in hand): the attempt's stay as they were."""
    [h] = _pending(db, cfg, ["p"])
    launchclaim.claim_all(db, [h.attempt_id], reclaim=False)
    _set(db, h.attempt_id, overrides={"lr": 0.1})
    launchrecord.record_submitted(db, h.attempt_id, "ext-p")
    with db.read() as s:
        a = s.get(Attempt, h.attempt_id)
        assert (a.state, a.external_id, a.overrides) == (A.SUBMITTED, "ext-p", {"lr": 0.1})


# ------------------------------------------------------------------------------------------
# births
# ------------------------------------------------------------------------------------------
def _born_by_lifecycle(s, names: list[str], sweep_id: int | None, env_id: int) -> None:
    """The oracle: lifecycle's constructors (create_job, create_attempt), as orch submit once made them."""
    for i, name in enumerate(names):
        job = create_job(s, JobState.PENDING, name=name, backend="local", run_dir=f"/runs/{name}",
                         command=["python", "t.py", name], resources={"cpus": 2}, outputs=["out/*"], max_attempts=4,
                         env_id=env_id, sweep_id=sweep_id, task_index=None if sweep_id is None else i)
        create_attempt(s, job, 1, new_token())


def _born_rows(db, names: list[str]) -> list[tuple[dict, dict]]:
    """Each named job's row and its attempt's, ids, names, tokens, sweeps and times left out."""
    out = []
    with db.read() as s:
        for name in names:
            job = dict(s.execute(select(Job.__table__).where(Job.name == name)).mappings().one())
            attempt = dict(s.execute(select(Attempt.__table__).where(Attempt.job_id == job["id"])).mappings().one())
            assert job["created_at"] <= job["updated_at"] and attempt["created_at"] >= job["created_at"]
            out.append(tuple({k: v for k, v in row.items() if k not in PER_ROW | TIMES | {"sweep_id"}}
                             for row in (job, attempt)))
    return out


@EXECUTORS
@pytest.mark.parametrize("in_sweep", [False, True], ids=["submit", "sweep"])
def test_births_written_once_leave_the_rows_lifecycles_constructors_leave(db, cfg, sched, executor, in_sweep):
    """A job and its first attempt (orch submit's one, or three tasks of a sweep) created by ``born_pending`` on each
    executor and database: every field as ``lifecycle.create_job``/``create_attempt`` write it, (job id, attempt id)
    of each in order."""
    with db.write() as s:
        env_id = environment_id(SessionExecutor(s), *environment_record({"ORCH_TEST": "1"}))
        sweeps = [Sweep(name=f"sw{k}", backend="local", params={}) for k in range(2)]
        s.add_all(sweeps)
        s.flush()
        oracle_sweep, our_sweep = (sw.id if in_sweep else None for sw in sweeps)
        _born_by_lifecycle(s, ["a0", "a1", "a2"] if in_sweep else ["a0"], oracle_sweep, env_id)
    ours = ["b0", "b1", "b2"] if in_sweep else ["b0"]
    born = [Newborn(n, f"/runs/{n}", ["python", "t.py", n], new_token(), k if in_sweep else None)
            for k, n in enumerate(ours)]
    common = Births("local", {"cpus": 2}, ["out/*"], 4, env_id, our_sweep)
    ids = _run_on(executor, db, cfg)(lambda ex: born_pending(ex, born, common, utcnow()))
    theirs = [n.replace("b", "a") for n in ours]

    def fields(names):  # the command names its job: compared below
        return [({k: v for k, v in j.items() if k != "command_json"}, a) for j, a in _born_rows(db, names)]

    assert fields(ours) == fields(theirs)
    with db.read() as s:
        assert ids == [(get_job(s, n).id, get_job(s, n).attempts[0].id) for n in ours]
        assert [get_job(s, n).command for n in ours] == [["python", "t.py", n] for n in ours]


# ------------------------------------------------------------------------------------------
# the sweep's row and the environment's
# ------------------------------------------------------------------------------------------
@EXECUTORS
def test_the_sweep_and_environment_rows_written_once_are_the_models_rows(db, cfg, sched, executor):
    """``new_sweep`` and ``environment_id`` on each executor and database leave the rows the models' constructors
    leave (``Sweep(...)``, ``Environment(...)``); an equal environment is found again, not inserted twice."""
    params = [{"lr": 0.1, "tag": "a"}, {"lr": 0.2, "tag": "b"}]
    with db.write() as s:
        s.add_all([Sweep(name="theirs", backend="slurm", throttle=3, params=params),
                   Environment(sha256="0" * 64, vars={"PATH": "/bin", "HOME": "/root"})])
    now = utcnow()
    digest, env_vars = environment_record({"PATH": "/bin", "HOME": "/root"})
    run = _run_on(executor, db, cfg)
    sweep_id = run(lambda ex: new_sweep(ex, "ours", "slurm", 3, params, now))
    first, again = (run(lambda ex: environment_id(ex, digest, env_vars)) for _ in range(2))
    other = run(lambda ex: environment_id(ex, *environment_record({"PATH": "/usr/bin"})))
    assert first == again != other
    with db.read() as s:
        sweeps = {r.name: r for r in s.execute(select(Sweep.__table__)).mappings()}
        envs = {r.id: r for r in s.execute(select(Environment.__table__)).mappings()}
    assert sweeps["ours"]["id"] == sweep_id and sweeps["ours"]["created_at"] == now
    assert ({k: v for k, v in sweeps["ours"].items() if k not in {"id", "name", "created_at"}}
            == {k: v for k, v in sweeps["theirs"].items() if k not in {"id", "name", "created_at"}})
    assert (envs[first]["sha256"], envs[first]["vars_json"]) == (digest, {"PATH": "/bin", "HOME": "/root"})
    assert envs[first]["vars_json"] == next(e["vars_json"] for e in envs.values() if e["sha256"] == "0" * 64)


@pytest.mark.parametrize("db_kind", ["postgres"], indirect=True)
def test_two_submitters_inserting_one_environment_at_once_both_go_on_with_one_row(db, cfg, db_kind):
    """PostgreSQL: the second insert of one digest waits for the first's commit; without ON CONFLICT DO NOTHING it
    then failed with a unique violation (the old path needed a savepoint per insert), and that submission with it."""
    digest, env_vars = environment_record({"ORCH_TEST": "race"})
    second: list = []
    with db.write() as s:
        first = environment_id(SessionExecutor(s), digest, env_vars)  # inserted, not committed yet

        def submitter() -> None:
            try:
                with db.write() as s2:
                    second.append(environment_id(SessionExecutor(s2), digest, env_vars))
            except Exception as e:  # the assert below shows it
                second.append(e)

        t = threading.Thread(target=submitter)
        t.start()
        with db.read() as watcher:  # the second insert waits on the first's row lock: observed, not slept on
            wait_for(lambda: watcher.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                                  "'Lock' AND datname = current_database()")).scalar()
                     or watcher.rollback(), 30, "the second insert waiting on the first")
    t.join(30)
    assert second == [first]
    with db.read() as s:
        assert s.execute(select(Environment.id).where(Environment.sha256 == digest)).scalars().all() == [first]
