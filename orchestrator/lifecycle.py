"""The two state machines — a job's and an attempt's — and their only writers.

What can happen to an attempt, and who may change it, is answered here and nowhere else:
``ATTEMPT_TRANSITIONS`` lists every edge with the event that causes it, and ``move_attempt`` is the
one function that writes ``attempts.state`` (``move_job`` the one that writes ``jobs.state``). Both
are compare-and-set: ``UPDATE ... WHERE id = :id AND state = :expected``; a mover that finds the row
in another state raises ``IllegalTransition`` and changes nothing, so two processes (cron
reconcilers, a user's requeue or cancel, a launcher) can never both act on the same state.

A job has at most one attempt that is not finished (``ATTEMPT_OPEN``); a job is *alive* while that
attempt is in ``ATTEMPT_LIVE`` — the backend may hold a process for it — and orch never starts the
next attempt while one may still run (issue 9: two attempts training in one run dir).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestrator.errors import IllegalTransition

# SQLAlchemy is imported inside the movers: `orch status`'s fast path reads the enums without it.
if TYPE_CHECKING:  # the models import this module's enums for their typed columns
    from sqlalchemy.orm import Session

    from orchestrator.models import Attempt, Job


def utcnow() -> datetime:
    """Naive UTC, as stored in the DB (SQLite has no time zones)."""
    return datetime.now(UTC).replace(tzinfo=None)


class JobState(enum.StrEnum):
    """A job's state (contract: the exact strings)."""

    PENDING = "pending"  # row exists, its attempt not yet accepted by a backend
    SUBMITTED = "submitted"  # backend accepted it; not seen running yet
    RUNNING = "running"
    DONE = "done_marker_verified"  # terminal; reachable only through a verified marker
    RETRYABLE_FAILED = "retryable_failed"
    FAILED = "failed"  # permanent: invalid, or out of attempts (an explicit requeue may revive it)
    CANCELLED = "cancelled"


class AttemptState(enum.StrEnum):
    """One attempt = one backend submission (Slurm's in-place requeues stay in it)."""

    PENDING = "pending"  # row written before any backend call; no launcher has claimed it
    LAUNCHING = "launching"  # a launcher claimed it (claimed_at) and may be calling the backend
    SUBMITTED = "submitted"  # the backend accepted it (external_id)
    RUNNING = "running"
    STOPPING = "stopping"  # orch asked it to stop (stop_reason, stop_requested_at); may still run
    SUCCEEDED = "succeeded"  # ended and the job's marker verified
    FAILED = "failed"  # ended without a verified marker (failure_class says why), or never launched
    CANCELLED = "cancelled"  # ended after orch cancel, or closed before launch (cancelled / verified)


J, A = JobState, AttemptState

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    J.PENDING: frozenset({
        J.SUBMITTED,  # its attempt was accepted by the backend (or found by token after a crash)
        J.RETRYABLE_FAILED,  # the launch failed for a reason a retry can fix (ENOSPC, a transient error)
        J.FAILED,  # the launch was refused for good (invalid partition, symlinked attempts/)
        J.CANCELLED,  # orch cancel before or during the launch
        J.DONE,  # a verified marker was found before launch (requeue raced a finishing job)
    }),
    J.SUBMITTED: frozenset({
        J.RUNNING,  # poll saw it start
        J.DONE,  # finished between two polls and its marker verifies
        J.RETRYABLE_FAILED,  # ended without a verified marker, class is retryable
        J.FAILED,  # ended, class is permanent or attempts are used up
        J.CANCELLED,
    }),
    J.RUNNING: frozenset({
        J.SUBMITTED,  # Slurm requeued it in place: pending again under the same id and attempt
        J.DONE,
        J.RETRYABLE_FAILED,
        J.FAILED,
        J.CANCELLED,
    }),
    J.RETRYABLE_FAILED: frozenset({
        J.PENDING,  # orch requeue / auto-requeue creates the next attempt
        J.FAILED,  # out of attempts
        J.CANCELLED,
        J.DONE,  # the marker verifies after all (a late writer finished): never rerun it
    }),
    J.FAILED: frozenset({
        J.PENDING,  # explicit `orch requeue NAME` after the user fixed the cause
        J.DONE,
    }),
    J.CANCELLED: frozenset({
        J.PENDING,  # explicit `orch requeue NAME`, once its attempt has stopped
        J.DONE,  # the cancelled attempt finished while stopping, and its marker verifies
    }),
    J.DONE: frozenset({
        # Terminal for everything automatic: a verified result is never rerun. The one way out is
        # an explicit `orch requeue NAME` that verified the marker AGAIN and found it no longer
        # verifies (a result corrupted or deleted after verification: `orch verify` says CORRUPT,
        # and "done" must not rest on a marker that is no longer true); the failure class
        # marker_corrupt/marker_missing is recorded, then the usual requeue path takes it.
        J.RETRYABLE_FAILED,
    }),
}

ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    A.PENDING: frozenset({
        A.LAUNCHING,  # a launcher (submit, requeue, a reconcile pass) claimed it
        A.CANCELLED,  # orch cancel before anyone claimed it, or its job verified meanwhile
    }),
    A.LAUNCHING: frozenset({
        A.LAUNCHING,  # re-claimed after the claim expired and the backend had no trace of its token
        A.SUBMITTED,  # the backend returned an id (or find_by_token found it after a crash)
        A.FAILED,  # the launch failed (refused, or a filesystem error); failure_class says which
        A.STOPPING,  # orch cancel during the launch: whoever learns the id stops it
        A.CANCELLED,  # its job verified before the backend call
    }),
    A.SUBMITTED: frozenset({
        A.RUNNING,  # poll saw it start
        A.STOPPING,  # orch cancel
        A.SUCCEEDED,  # ended between two polls; the marker verifies
        A.FAILED,  # ended without a verified marker
    }),
    A.RUNNING: frozenset({
        A.SUBMITTED,  # Slurm requeued it in place (same id, same attempt)
        A.STOPPING,  # orch cancel, or the reconciler stops a hung job
        A.SUCCEEDED,
        A.FAILED,
    }),
    A.STOPPING: frozenset({
        A.SUCCEEDED,  # it finished while stopping, and its marker verifies
        A.FAILED,  # it ended (a hang stop is classified hang)
        A.CANCELLED,  # it ended after orch cancel, or the backend never had it
    }),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.CANCELLED: frozenset(),
}

# Nothing automatic leaves these (done's one edge out is an explicit requeue that re-verified it).
JOB_TERMINAL = frozenset({J.DONE})
ATTEMPT_ENDED = frozenset(s for s, nxt in ATTEMPT_TRANSITIONS.items() if not nxt)
ATTEMPT_OPEN = frozenset(AttemptState) - ATTEMPT_ENDED  # not finished: at most one per job
# The backend may hold a process for these (a launching attempt may have been submitted already).
ATTEMPT_LIVE = frozenset({A.LAUNCHING, A.SUBMITTED, A.RUNNING, A.STOPPING})
ATTEMPT_POLLED = frozenset({A.SUBMITTED, A.RUNNING, A.STOPPING})  # have an id the backend is asked about
JOB_LIVE = frozenset({J.SUBMITTED, J.RUNNING})
# Nothing more happens to these without a command (or the reconciler's auto-requeue).
JOB_SETTLED = frozenset({J.DONE, J.FAILED, J.CANCELLED, J.RETRYABLE_FAILED})

# Back-compat names (the job table was all there was).
TRANSITIONS = JOB_TRANSITIONS
TERMINAL = JOB_TERMINAL
LIVE = JOB_LIVE
SETTLED = JOB_SETTLED


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in JOB_TRANSITIONS[src]


def can_move_attempt(src: AttemptState, dst: AttemptState) -> bool:
    return dst in ATTEMPT_TRANSITIONS[src]


def move_job(s: Session, job: Job, dst: JobState, reason: str = "") -> None:
    """Move ``job`` to ``dst`` if the table allows it and nobody moved it first (compare-and-set).

    Raises IllegalTransition for an edge not in ``JOB_TRANSITIONS`` or when the row's state is no
    longer the one this process read. The event row is written in the same transaction.
    """
    src = JobState(job.state)
    if not can_transition(src, dst):
        raise IllegalTransition(f"job {job.name}: {src.value} -> {dst.value} is not allowed")
    from sqlalchemy import update

    from orchestrator.models import Event

    now = utcnow()
    res = s.execute(update(type(job)).where(type(job).id == job.id, type(job).state == src)
                    .values(state=dst, updated_at=now).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        raise IllegalTransition(f"job {job.name}: state changed under us (expected {src.value})")
    s.add(Event(job_id=job.id, at=now, from_state=src.value, to_state=dst.value, reason=reason[:2000]))
    job.state = dst
    job.updated_at = now


def move_attempt(s: Session, attempt: Attempt, dst: AttemptState, *, expect: AttemptState | None = None,
                 where: Any = None, **values: Any) -> None:
    """Move ``attempt`` to ``dst`` (compare-and-set on the state this process read, or ``expect``),
    writing ``values`` (ended_at, failure_class, external_id, ...) in the same UPDATE.

    The only writer of ``attempts.state``. ``ended_at`` is filled in when ``dst`` ends the attempt.
    ``where``: an extra SQL condition of the compare-and-set (e.g. "the claim has expired").
    """
    src = AttemptState(expect if expect is not None else attempt.state)
    if not can_move_attempt(src, dst):
        raise IllegalTransition(f"attempt {attempt.n}: {src.value} -> {dst.value} is not allowed")
    if dst in ATTEMPT_ENDED and "ended_at" not in values:
        values["ended_at"] = utcnow()
    from sqlalchemy import update

    model = type(attempt)
    stmt = update(model).where(model.id == attempt.id, model.state == src)
    if where is not None:
        stmt = stmt.where(where)
    res = s.execute(stmt.values(state=dst, **values).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        raise IllegalTransition(f"attempt {attempt.n}: state changed under us (expected {src.value})")
    attempt.state = dst
    for k, v in values.items():
        setattr(attempt, k, v)


def set_attempt_fields(s: Session, attempt: Attempt, expect: AttemptState, **values: Any) -> bool:
    """Write fields of an attempt (no state change) only while it is still in ``expect``.

    For facts learnt about an attempt in its current state (Slurm restarts, the id of a launch that
    a cancel overtook). Returns False, writing nothing, if the attempt moved on meanwhile.
    """
    from sqlalchemy import update

    model = type(attempt)
    res = s.execute(update(model).where(model.id == attempt.id, model.state == expect)
                    .values(**values).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return False
    for k, v in values.items():
        setattr(attempt, k, v)
    return True


def open_attempt(job: Job) -> Attempt | None:
    """The job's one unfinished attempt, if any (attempts are ordered by n)."""
    for a in reversed(job.attempts):
        if AttemptState(a.state) in ATTEMPT_OPEN:
            return a
    return None


def latest_attempt(job: Job) -> Attempt | None:
    return job.attempts[-1] if job.attempts else None


def claim_expired(claimed_at: datetime | None, now: datetime, grace_s: float) -> bool:
    return claimed_at is None or claimed_at < now - timedelta(seconds=grace_s)


def describe_edges(table: Mapping[Any, frozenset[Any]]) -> list[tuple[str, str]]:
    """Every (src, dst) edge as strings: what the edge-walk test and the docs list."""
    return sorted((src.value, dst.value) for src, dsts in table.items() for dst in dsts)
