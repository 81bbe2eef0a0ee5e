"""Each lifecycle move is ONE guarded write, counted on a real SQLite file (before, every move wrote the
state twice, the compare-and-set UPDATE and then an unguarded UPDATE of the ORM object at commit)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, select

from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState, move_attempt, move_job
from orchestrator.core.models import Attempt, Job

A, J = AttemptState, JobState


@contextmanager
def updates(db) -> Iterator[list[str]]:
    """Every UPDATE statement the engine sends while the block runs (commit included)."""
    seen: list[str] = []

    def count(_conn, _cursor, statement, _params, _context, _many) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


def _job_with_attempt(db, name: str = "j") -> None:
    with db.write() as s:
        job = Job(name=name, state=J.PENDING, backend="local", run_dir=f"/nowhere/{name}", command=["true"])
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, n=1, token=f"tok-{name}", state=A.PENDING, backend="local"))


def test_a_job_move_is_one_guarded_update(db):
    _job_with_attempt(db)
    with updates(db) as seen, db.write() as s:
        move_job(s, get_job(s, "j"), J.SUBMITTED, "accepted")
    assert len(seen) == 1, seen
    assert "state = ?" in seen[0].split("WHERE", 1)[1], "the one UPDATE is the compare-and-set"
    with db.read() as s:
        assert get_job(s, "j").state is J.SUBMITTED


def test_an_attempt_move_with_fields_is_one_guarded_update(db):
    _job_with_attempt(db)
    with updates(db) as seen, db.write() as s:
        a = s.scalar(select(Attempt))
        move_attempt(s, a, A.LAUNCHING, claimed_at=None, fence=1)
        a.job  # noqa: B018 - touching the row after the move must not make it dirty
    attempt_updates = [u for u in seen if u.lstrip().upper().startswith("UPDATE ATTEMPTS")]
    assert len(attempt_updates) == 1, seen
    with db.read() as s:
        a = s.scalar(select(Attempt))
        assert (a.state, a.fence) == (A.LAUNCHING, 1)


def test_the_moved_row_reads_its_new_state_in_the_same_session(db):
    _job_with_attempt(db)
    with db.write() as s:
        job = get_job(s, "j")
        move_job(s, job, J.CANCELLED, "orch cancel")
        assert job.state is J.CANCELLED  # callers go on deciding from the object they moved
        a = job.attempts[0]
        move_attempt(s, a, A.CANCELLED, detail="cancelled before launch")
        assert (a.state, a.detail) == (A.CANCELLED, "cancelled before launch")
        assert a.ended_at is not None


# ------------------------------------------------------------------------------------------
# writes that bypassed the guard
# ------------------------------------------------------------------------------------------
def test_unverifying_a_done_job_leaves_its_succeeded_attempt_unclassified(db):
    # A succeeded attempt did succeed: its result broke later. Stamped marker_corrupt, it read as a failed
    # attempt in orch show and in the policy's history.
    from orchestrator import protocol
    from orchestrator.ops.requeue import _unverify

    _job_with_attempt(db)
    with db.write() as s:
        job = get_job(s, "j")
        move_attempt(s, job.attempts[0], A.LAUNCHING)
        move_attempt(s, job.attempts[0], A.SUBMITTED)
        move_attempt(s, job.attempts[0], A.SUCCEEDED)
        move_job(s, job, J.DONE, "attempt 1: marker verified")
    _unverify(db, "j", protocol.Verification(protocol.MarkerStatus.CORRUPT, "sha256 mismatch"))
    with db.read() as s:
        job = get_job(s, "j")
        a = job.attempts[0]
        assert (job.state, a.state, a.failure_class) == (J.RETRYABLE_FAILED, A.SUCCEEDED, None)


def test_a_transient_submission_failure_notes_its_detail_only_under_its_own_claim(db, cfg):
    # The launcher noted "submission failed" with a plain ORM write: after a re-claimer took the attempt
    # (a new fence) the stale launcher's note overwrote the new launch's detail.
    import pytest

    from orchestrator.backends.base import BackendError
    from orchestrator.errors import OrchError
    from orchestrator.ops.launchrecord import submission_failed

    _job_with_attempt(db)
    with db.write() as s:
        a = s.scalar(select(Attempt))
        move_attempt(s, a, A.LAUNCHING, fence=2, detail="re-claimed")  # the stale launcher held fence 1

    class Stale:
        name, attempt_id, fence = "j", a.id, 1

    with pytest.raises(OrchError):
        submission_failed(db, cfg, [Stale()], BackendError("sbatch: socket timed out"))
    with db.read() as s:
        assert s.scalar(select(Attempt)).detail == "re-claimed"
    Stale.fence = 2
    with pytest.raises(OrchError):
        submission_failed(db, cfg, [Stale()], BackendError("sbatch: socket timed out"))
    with db.read() as s:
        assert s.scalar(select(Attempt)).detail.startswith("submission failed (will be retried)")


def test_ending_an_attempt_is_one_guarded_update_of_the_attempt_and_one_of_its_job(db, cfg):
    # finish() carries the policy's decision (auto_requeue, retry_not_before) to the job: set as ORM
    # attributes beside the move, they flushed as a second, unguarded UPDATE of the job.
    from orchestrator.ops.attemptend import finish
    from orchestrator.protocol import FailureClass

    _job_with_attempt(db)
    with db.write() as s:
        move_attempt(s, s.scalar(select(Attempt)), A.LAUNCHING)
    with updates(db) as seen:
        finish(db, cfg, 1, None, launch_failure=(FailureClass.ENOSPC, "launch failed: disk full"))
    assert [u.split()[1] for u in seen] == ["attempts", "jobs"], seen
    with db.read() as s:
        job = get_job(s, "j")
        assert (job.state, job.auto_requeue, job.attempts[0].state) == (J.RETRYABLE_FAILED, True, A.FAILED)
        assert job.retry_not_before is not None  # a launch onto a full disk backs off


def test_a_row_is_born_only_in_a_declared_state(db):
    import pytest

    from orchestrator.core.lifecycle import JOB_BIRTH_STATES, create_job
    from orchestrator.errors import IllegalTransition

    assert JOB_BIRTH_STATES == {J.PENDING, J.DONE}
    with pytest.raises(IllegalTransition, match="cannot be created running"), db.write() as s:
        create_job(s, J.RUNNING, name="r", backend="local", run_dir="/nowhere/r", command=["true"])
    with db.write() as s:
        create_job(s, J.DONE, "its run dir's marker verified at sweep submission", name="d", backend="local",
                   run_dir="/nowhere/d", command=["true"])
    from orchestrator.views.show import history
    with db.read() as s:
        job = get_job(s, "d")
        assert [(e["from"], e["to"], e["reason"]) for e in history(s, job)] == [
            (None, "done_marker_verified", "its run dir's marker verified at sweep submission")]


@pytest.mark.parametrize("said", ["preempted", None])
def test_an_attempt_cancelled_outside_orch_ends_instead_of_staying_running_for_ever(db, cfg, said):
    # scancel by a user: classify says cancelled, but running -> cancelled was no edge, so finish() raised
    # IllegalTransition, the pass swallowed it, and every later pass did the same: running for ever.
    from orchestrator import protocol
    from orchestrator.backends.base import Outcome, Phase
    from orchestrator.ops.attemptend import Evidence, finish
    from orchestrator.protocol import FailureClass, FailureReport

    _job_with_attempt(db)
    with db.write() as s:
        job = get_job(s, "j")
        for st in (A.LAUNCHING, A.SUBMITTED, A.RUNNING):
            move_attempt(s, job.attempts[0], st)
        move_job(s, job, J.SUBMITTED)
        move_job(s, job, J.RUNNING)
    report = FailureReport(FailureClass(said), 3) if said else None  # the program's word, or none at all
    ev = Evidence(protocol.Verification(protocol.MarkerStatus.ABSENT), report,
                  Outcome(Phase.EXITED, exit_code=143, backend_state="CANCELLED", cause=FailureClass.CANCELLED), None)
    finish(db, cfg, 1, ev)
    with db.read() as s:
        job = get_job(s, "j")
        assert (job.attempts[0].state, job.attempts[0].failure_class, job.state) == (
            A.CANCELLED, FailureClass.CANCELLED, J.CANCELLED)


def test_a_bulk_move_whose_guard_misses_one_row_writes_nothing(db):
    # move_many (one executemany per step of a sweep's launch) decides on rows read in its own
    # transaction; if any row moved anyway (a reader that was not under the lock), every UPDATE and event of
    # the batch rolls back together rather than leaving the others moved and that one unmoved.
    from sqlalchemy import func, update

    from orchestrator.core.lifecycle import Move, move_many
    from orchestrator.core.models import Event
    from orchestrator.errors import IllegalTransition

    for n in ("a", "b", "c"):
        _job_with_attempt(db, n)
    with pytest.raises(IllegalTransition), db.write() as s:
        rows = list(s.scalars(select(Attempt).order_by(Attempt.id)))
        # another writer's move of "b", behind this session's back (the session still reads it pending)
        s.execute(update(Attempt).where(Attempt.id == rows[1].id).values(state=A.LAUNCHING, fence=7)
                  .execution_options(synchronize_session=False))
        move_many(s, [Move(a, A.PENDING, A.LAUNCHING, {"fence": 1}, fenced=True, fence=a.fence, why="claimed")
                      for a in rows])
    with db.read() as s:
        assert [a.state for a in s.scalars(select(Attempt).order_by(Attempt.id))] == [A.PENDING] * 3
        assert s.scalar(select(func.count()).select_from(Event)) == 0


def test_a_bulk_move_writes_each_row_its_values_and_its_event(db):
    from sqlalchemy import func

    from orchestrator.core.lifecycle import Move, move_many
    from orchestrator.core.models import Event

    for n in ("a", "b"):
        _job_with_attempt(db, n)
    with db.write() as s:
        rows = list(s.scalars(select(Attempt).order_by(Attempt.id)))
        move_many(s, [Move(a, A.PENDING, A.LAUNCHING, {"fence": i + 1}, fenced=True, fence=a.fence, why=f"c{i}")
                      for i, a in enumerate(rows)])
        assert [a.fence for a in rows] == [1, 2]  # the session sees what was written
    with db.read() as s:
        assert [(a.state, a.fence) for a in s.scalars(select(Attempt).order_by(Attempt.id))] == \
            [(A.LAUNCHING, 1), (A.LAUNCHING, 2)]
        assert sorted(s.scalars(select(Event.reason))) == ["c0", "c1"]
        assert s.scalar(select(func.count()).select_from(Event).where(Event.attempt_id.is_(None))) == 0
