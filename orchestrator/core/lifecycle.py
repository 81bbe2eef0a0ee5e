"""What can happen to a job and to an attempt, and which function does it: the two state machines as data,
and their only writers.

- ``JOB_EDGES`` / ``ATTEMPT_EDGES``: every move as ``Edge(src, dst, trigger, taker)``; ``taker`` is the one
  function (``module.function``) that takes it. A state pair may appear twice, with two triggers.
- ``JOB_BIRTHS`` / ``ATTEMPT_BIRTHS``: the states a row may be created in, why, and by whom.
- The states themselves, each with a comment on when it is entered: ``orchestrator.core.states``.
- ``move_job`` / ``move_attempt`` are the only writers of ``state``, ``create_job`` / ``create_attempt`` the only
  constructors of rows (a test walks the AST of every other module). Each move is ONE compare-and-set
  ``UPDATE ... WHERE id = :id AND state = :expected`` carrying every field the move writes, and one event row:
  a mover that finds the row in another state raises ``IllegalTransition`` and changes nothing, so two
  processes (cron reconcilers, a user's requeue or cancel, a launcher) never both act on one state.
- ``python -m orchestrator.core.lifecycle --mermaid`` prints the diagram checked in as ``docs/lifecycle.md``.

A job has at most one attempt that is not finished (``ATTEMPT_OPEN``); a job is *alive* while that attempt
is in ``ATTEMPT_LIVE`` (the backend may hold a process for it), and orch never starts the next attempt while
one may still run (two attempts training in one run dir).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from orchestrator.core import trackerend
from orchestrator.core.models import Attempt, Event, Job
from orchestrator.core.states import AttemptState, JobState, Note, StopReason, utcnow
from orchestrator.errors import IllegalTransition

__all__ = ["AttemptState", "JobState", "Note", "StopReason", "utcnow", "Edge", "Birth", "JOB_EDGES",
           "ATTEMPT_EDGES", "JOB_BIRTHS", "ATTEMPT_BIRTHS", "move_job", "move_attempt", "set_attempt_fields",
           "create_job", "create_attempt", "note_held", "held_reason"]

J, A = JobState, AttemptState


@dataclass(frozen=True)
class Edge:
    """One move: ``src`` -> ``dst`` when ``trigger`` happens, taken by ``taker`` (``module.function``)."""

    src: Any
    dst: Any
    trigger: str
    taker: str


@dataclass(frozen=True)
class Birth:
    """A row may be created in ``state`` when ``trigger`` happens, by ``taker``."""

    state: Any
    trigger: str
    taker: str


JOB_EDGES: tuple[Edge, ...] = (
    Edge(J.PENDING, J.SUBMITTED, "its attempt was accepted by the backend (or found by token after a crash), on "
         "either path", "core.transactions.record_submitted"),
    Edge(J.PENDING, J.RETRYABLE_FAILED, "the launch failed for a reason a retry can fix (ENOSPC, a transient error)",
         "ops.attemptend.finish"),
    Edge(J.PENDING, J.FAILED, "the launch was refused for good (invalid partition, symlinked attempts/)",
         "ops.attemptend.finish"),
    Edge(J.PENDING, J.CANCELLED, "orch cancel before or during the launch", "ops.cancel.cancel"),
    Edge(J.PENDING, J.DONE, "its marker verified before the backend call (a requeue raced a finishing job)",
         "ops.launchrecord.close_verified"),
    Edge(J.SUBMITTED, J.RUNNING, "a poll saw its attempt run", "ops.attemptpoll._apply"),
    Edge(J.SUBMITTED, J.DONE, "its attempt ended between two polls and the marker verifies", "ops.attemptend.finish"),
    Edge(J.SUBMITTED, J.RETRYABLE_FAILED, "its attempt ended unverified; the class is retryable",
         "ops.attemptend.finish"),
    Edge(J.SUBMITTED, J.FAILED, "its attempt ended unverified; permanent class, or out of attempts",
         "ops.attemptend.finish"),
    Edge(J.SUBMITTED, J.CANCELLED, "orch cancel", "ops.cancel.cancel"),
    Edge(J.SUBMITTED, J.CANCELLED, "the scheduler cancelled its attempt outside orch (scancel)",
         "ops.attemptend.finish"),
    Edge(J.RUNNING, J.SUBMITTED, "Slurm requeued it in place (pending again, same id and attempt)",
         "ops.attemptpoll._apply"),
    Edge(J.RUNNING, J.DONE, "its attempt ended and the marker verifies", "ops.attemptend.finish"),
    Edge(J.RUNNING, J.RETRYABLE_FAILED, "its attempt ended unverified; the class is retryable",
         "ops.attemptend.finish"),
    Edge(J.RUNNING, J.FAILED, "its attempt ended unverified; permanent class, or out of attempts",
         "ops.attemptend.finish"),
    Edge(J.RUNNING, J.CANCELLED, "orch cancel", "ops.cancel.cancel"),
    Edge(J.RUNNING, J.CANCELLED, "the scheduler cancelled its attempt outside orch (scancel)", "ops.attemptend.finish"),
    Edge(J.RETRYABLE_FAILED, J.PENDING, "orch requeue, or the reconciler's auto-requeue, created the next attempt",
         "ops.requeue._requeue_one"),
    # Kept from the first table; no attempt is open while its job is retryable_failed, so nothing takes it today.
    Edge(J.RETRYABLE_FAILED, J.FAILED, "an attempt still open ended out of attempts (not reached today)",
         "ops.attemptend.finish"),
    Edge(J.RETRYABLE_FAILED, J.CANCELLED, "orch cancel", "ops.cancel.cancel"),
    Edge(J.RETRYABLE_FAILED, J.DONE, "orch requeue found its marker verifies after all (a late writer finished)",
         "ops.requeue._mark_verified"),
    Edge(J.FAILED, J.PENDING, "an explicit `orch requeue NAME` after the user fixed the cause",
         "ops.requeue._requeue_one"),
    Edge(J.FAILED, J.DONE, "orch requeue found its marker verifies", "ops.requeue._mark_verified"),
    Edge(J.CANCELLED, J.PENDING, "an explicit `orch requeue NAME`, once its attempt has stopped",
         "ops.requeue._requeue_one"),
    Edge(J.CANCELLED, J.DONE, "its cancelled attempt finished while stopping, and the marker verifies",
         "ops.attemptend.finish"),
    Edge(J.CANCELLED, J.DONE, "orch requeue found its marker verifies", "ops.requeue._mark_verified"),
    # Terminal for everything automatic: a verified result is never rerun. The one way out is an explicit
    # `orch requeue NAME` that verified the marker AGAIN and found it no longer verifies ("done" must not rest
    # on a marker that is no longer true); the class is recorded in the event, then the usual requeue path.
    Edge(J.DONE, J.RETRYABLE_FAILED, "orch requeue NAME re-verified it: marker_corrupt or marker_missing",
         "ops.requeue._unverify"),
)

ATTEMPT_EDGES: tuple[Edge, ...] = (
    Edge(A.PENDING, A.LAUNCHING, "a launcher (submit, sweep, requeue, a reconcile pass; either path) claimed it",
         "core.transactions.claim_pending"),
    Edge(A.PENDING, A.CANCELLED, "orch cancel before anyone claimed it", "ops.cancel.cancel"),
    Edge(A.PENDING, A.CANCELLED, "orch requeue found its job's marker verifies", "ops.requeue._mark_verified"),
    Edge(A.LAUNCHING, A.LAUNCHING, "re-claimed after the claim expired (a new fence)", "ops.launchclaim.claim_all"),
    Edge(A.LAUNCHING, A.SUBMITTED, "the backend returned an id (or find_by_token found it after a crash), on either "
         "path; a group's ids in one transaction", "core.transactions.record_submitted"),
    Edge(A.LAUNCHING, A.SUBMITTED, "the backend returned an id for an attempt whose job is no longer pending (not "
         "reached today: a cancel stops the attempt too)", "ops.launchrecord.record_in"),
    Edge(A.LAUNCHING, A.FAILED, "the launch failed (refused, or a filesystem error); failure_class says which",
         "ops.attemptend.finish"),
    Edge(A.LAUNCHING, A.STOPPING, "orch cancel during the launch: whoever learns the id stops it", "ops.cancel.cancel"),
    Edge(A.LAUNCHING, A.CANCELLED, "its job's marker verified before the backend call",
         "ops.launchrecord.close_verified"),
    Edge(A.LAUNCHING, A.CANCELLED, "orch requeue found its job's marker verifies", "ops.requeue._mark_verified"),
    Edge(A.SUBMITTED, A.RUNNING, "a poll saw it run", "ops.attemptpoll._apply"),
    Edge(A.SUBMITTED, A.STOPPING, "orch cancel", "ops.cancel.cancel"),
    Edge(A.SUBMITTED, A.SUCCEEDED, "it ended between two polls and the marker verifies", "ops.attemptend.finish"),
    Edge(A.SUBMITTED, A.FAILED, "it ended without a verified marker", "ops.attemptend.finish"),
    # Not a free resume (classify: cancelled); with no edge here finish() raised, and the pass left it running.
    Edge(A.SUBMITTED, A.CANCELLED, "the scheduler cancelled it outside orch (scancel)", "ops.attemptend.finish"),
    Edge(A.RUNNING, A.SUBMITTED, "Slurm requeued it in place (same id, same attempt)", "ops.attemptpoll._apply"),
    Edge(A.RUNNING, A.STOPPING, "orch cancel", "ops.cancel.cancel"),
    Edge(A.RUNNING, A.STOPPING, "no heartbeat for policy.hang_timeout_s: the reconciler stops it (hang)",
         "ops.attemptpoll._apply"),
    Edge(A.RUNNING, A.SUCCEEDED, "it ended and the marker verifies", "ops.attemptend.finish"),
    Edge(A.RUNNING, A.FAILED, "it ended without a verified marker", "ops.attemptend.finish"),
    Edge(A.RUNNING, A.CANCELLED, "the scheduler cancelled it outside orch (scancel)", "ops.attemptend.finish"),
    Edge(A.STOPPING, A.SUCCEEDED, "it finished while stopping, and the marker verifies", "ops.attemptend.finish"),
    Edge(A.STOPPING, A.FAILED, "it ended unverified (a hang stop is classified hang)", "ops.attemptend.finish"),
    Edge(A.STOPPING, A.CANCELLED, "it ended after orch cancel", "ops.attemptend.finish"),
    Edge(A.STOPPING, A.CANCELLED, "a cancel landed while its launcher prepared: closed before the backend call",
         "ops.launchclaim.check_claims"),
    Edge(A.STOPPING, A.CANCELLED, "its launcher died after a cancel and the backend never had it",
         "ops.reconcile._stop_overtaken"),
)

JOB_BIRTHS: tuple[Birth, ...] = (
    Birth(J.PENDING, "orch submit, or orch sweep (one job per task), on either path", "core.transactions.born_pending"),
    # A lost DB: the task's run dir already holds a verified result of the same arguments. Never rerun.
    Birth(J.DONE, "orch sweep: the task's run dir already holds its verified marker", "ops.sweep.submit_sweep"),
)

ATTEMPT_BIRTHS: tuple[Birth, ...] = (
    Birth(A.PENDING, "orch submit, or orch sweep (each task not already done), on either path: attempt 1",
          "core.transactions.born_pending"),
    Birth(A.PENDING, "orch requeue / auto-requeue: the next attempt, in the job's move to pending",
          "ops.requeue._requeue_one"),
)


def _table(edges: tuple[Edge, ...], states: type) -> dict[Any, frozenset[Any]]:
    return {s: frozenset(e.dst for e in edges if e.src is s) for s in states}


JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = _table(JOB_EDGES, JobState)
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = _table(ATTEMPT_EDGES, AttemptState)
JOB_BIRTH_STATES = frozenset(b.state for b in JOB_BIRTHS)
ATTEMPT_BIRTH_STATES = frozenset(b.state for b in ATTEMPT_BIRTHS)

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


# ------------------------------------------------------------------------------------------
# the writers
# ------------------------------------------------------------------------------------------
def _committed(row: Any, values: Mapping[str, Any]) -> None:
    """Show the row's new values to this session WITHOUT marking them changed: the guarded UPDATE already
    wrote them. Set as plain attributes, the ORM wrote state again at commit, unguarded."""
    for k, v in values.items():
        set_committed_value(row, k, v)


def _event(s: Session, job_id: int, src: str | None, dst: str, reason: str, attempt_id: int | None = None,
           at: datetime | None = None) -> None:
    s.add(Event(job_id=job_id, attempt_id=attempt_id, at=at or utcnow(), from_state=src, to_state=dst,
                reason=reason[:2000]))


def move_job(s: Session, job: Job, dst: JobState, reason: str = "", **values: Any) -> None:
    """Move ``job`` to ``dst`` if an edge allows it and nobody moved it first (compare-and-set), writing
    ``values`` (overrides, auto_requeue, ...) in the same UPDATE and an event row in the same transaction.

    Raises IllegalTransition for a pair that is no edge of ``JOB_EDGES`` or when the row's state is no
    longer the one this process read.
    """
    src = JobState(job.state)
    if not can_transition(src, dst):
        raise IllegalTransition(f"job {job.name}: {src.value} -> {dst.value} is not allowed")
    values = {**values, "state": dst, "updated_at": utcnow()}
    res = s.execute(update(Job).where(Job.id == job.id, Job.state == src)
                    .values(**values).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        raise IllegalTransition(f"job {job.name}: state changed under us (expected {src.value})")
    _event(s, job.id, src.value, dst.value, reason, at=values["updated_at"])
    _committed(job, values)
    trackerend.note(s, job.run_dir, dst)


def move_attempt(s: Session, attempt: Attempt, dst: AttemptState, *, expect: AttemptState | None = None,
                 where: Any = None, why: str = "", **values: Any) -> None:
    """Move ``attempt`` to ``dst`` (compare-and-set on the state this process read, or ``expect``),
    writing ``values`` (ended_at, failure_class, external_id, ...) in the same UPDATE, and an event row
    (the attempt's history: ``why``, else its ``detail``).

    ``ended_at`` is filled in when ``dst`` ends the attempt. ``where``: an extra SQL condition of the
    compare-and-set (e.g. "the claim is still this launcher's fence").
    """
    src = AttemptState(expect if expect is not None else attempt.state)
    if not can_move_attempt(src, dst):
        raise IllegalTransition(f"attempt {attempt.n}: {src.value} -> {dst.value} is not allowed")
    if dst in ATTEMPT_ENDED and "ended_at" not in values:
        values["ended_at"] = utcnow()
    stmt = update(Attempt).where(Attempt.id == attempt.id, Attempt.state == src)
    if where is not None:
        stmt = stmt.where(where)
    res = s.execute(stmt.values(state=dst, **values).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        raise IllegalTransition(f"attempt {attempt.n}: state changed under us (expected {src.value})")
    _event(s, attempt.job_id, src.value, dst.value, why or str(values.get("detail") or ""), attempt.id)
    _committed(attempt, {"state": dst, **values})


@dataclass
class Move:
    """One compare-and-set of ``move_many``: the row, the state it must still be in, its new state (None:
    fields only, no event), the values written with it, the fence it must still hold (``fenced``), and
    the event's reason."""

    row: Any  # an Attempt or a Job
    expect: AttemptState | JobState
    dst: AttemptState | JobState | None = None
    values: dict[str, Any] = field(default_factory=dict)
    fenced: bool = False
    fence: int | None = None
    why: str = ""


def move_many(s: Session, moves: list[Move]) -> None:
    """Apply many moves (``move_attempt``/``move_job``/``set_attempt_fields`` each) as one executemany per
    statement shape, their event rows in one INSERT. A 1,000-task sweep spent most of its time
    building 10,000 single-row statements.

    For rows this transaction holds and decided on (read under SQLite's write lock, or ``FOR UPDATE``):
    every UPDATE is still guarded by the state (and the fence), and if any guard matched no row,
    IllegalTransition is raised so that the caller's transaction rolls back as a whole (nothing written)."""
    now = utcnow()
    shapes: dict[tuple, list[tuple[Move, dict[str, Any]]]] = {}
    events: list[dict[str, Any]] = []
    for m in moves:
        is_job = isinstance(m.row, Job)
        values = dict(m.values)
        if m.dst is not None:
            ok = can_transition(m.expect, m.dst) if is_job else can_move_attempt(m.expect, m.dst)
            if not ok:
                raise IllegalTransition(f"{m.expect.value} -> {m.dst.value} is not allowed")
            values["state"] = m.dst
            if is_job:
                values["updated_at"] = now
            elif m.dst in ATTEMPT_ENDED and "ended_at" not in values:
                values["ended_at"] = now
            events.append({"job_id": m.row.id if is_job else m.row.job_id, "attempt_id": None if is_job else m.row.id,
                           "at": now, "from_state": m.expect.value, "to_state": m.dst.value,
                           "reason": (m.why or str(values.get("detail") or ""))[:2000]})
        fence = None if not m.fenced else ("null" if m.fence is None else "eq")
        shapes.setdefault((is_job, tuple(sorted(values)), fence), []).append((m, values))
    multi_rowcount = s.get_bind().dialect.supports_sane_multi_rowcount
    for (is_job, cols, fence), items in shapes.items():
        model = Job if is_job else Attempt
        col = model.__mapper__.columns  # attribute name -> column (``overrides`` is ``overrides_json``)
        stmt = update(model.__table__).where(col["id"] == bindparam("m_id"), col["state"] == bindparam("m_expect"))
        if fence == "eq":
            stmt = stmt.where(col["fence"] == bindparam("m_fence"))
        elif fence == "null":
            stmt = stmt.where(col["fence"].is_(None))
        stmt = stmt.values({col[c]: bindparam(f"v_{c}") for c in cols})
        params = [{"m_id": m.row.id, "m_expect": m.expect, **({"m_fence": m.fence} if fence == "eq" else {}),
                   **{f"v_{c}": v for c, v in values.items()}} for m, values in items]
        res = s.execute(stmt, params)
        if multi_rowcount and res.rowcount != len(params):
            raise IllegalTransition(f"{len(params) - res.rowcount} of {len(params)} rows changed under us")
    for items in shapes.values():
        for m, values in items:
            _committed(m.row, values)
            if isinstance(m.row, Job) and m.dst is not None:
                trackerend.note(s, m.row.run_dir, JobState(m.dst))
    if events:
        s.execute(insert(Event.__table__), events)


def set_attempt_fields(s: Session, attempt: Attempt, expect: AttemptState, *, where: Any = None,
                       **values: Any) -> bool:
    """Write fields of an attempt (no state change) only while it is still in ``expect`` (and ``where``).

    For facts learnt about an attempt in its current state (Slurm restarts, the id of a launch that
    a cancel overtook, a launcher's note under its own fence). Returns False, writing nothing, if the
    attempt moved on meanwhile.
    """
    stmt = update(Attempt).where(Attempt.id == attempt.id, Attempt.state == expect)
    if where is not None:
        stmt = stmt.where(where)
    res = s.execute(stmt.values(**values).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return False
    _committed(attempt, values)
    return True


def create_job(s: Session, state: JobState, why: str = "", *, flush: bool = True, **fields: Any) -> Job:
    """A new job row, born in one of ``JOB_BIRTHS``' states. Born pending, its history starts with its first
    move; born in any other state, an event from None says why (a sweep task found already done).

    ``flush=False`` (a pending job): its INSERT waits for the caller's next flush, which then writes many
    jobs at once (a sweep flushed 1,000 times); its ``id`` is None until then."""
    if state not in JOB_BIRTH_STATES:
        raise IllegalTransition(f"job {fields.get('name')}: cannot be created {state.value}")
    job = Job(state=state, **fields)
    s.add(job)
    if flush or state is not J.PENDING:
        s.flush()
    if state is not J.PENDING:
        _event(s, job.id, None, state.value, why)
    return job


def create_attempt(s: Session, job: Job, n: int, token: str, **fields: Any) -> Attempt:
    """Attempt ``n`` of ``job``, born pending (``ATTEMPT_BIRTHS``): written before any backend call."""
    a = Attempt(job_id=job.id, n=n, token=token, state=A.PENDING, backend=job.backend, **fields)
    s.add(a)
    return a


def note_held(s: Session, job: Job, reason: str) -> None:
    """Record why the job's next attempt was not launched: a ``Note.HELD`` event (from == to) that ``orch
    show`` prints; written again only when the reason changed, not on every pass."""
    text = (Note.HELD + reason)[:2000]
    last = s.scalar(select(Event.reason).where(Event.job_id == job.id, Event.attempt_id.is_(None))
                    .order_by(Event.id.desc()).limit(1))
    if last != text:
        _event(s, job.id, job.state.value, job.state.value, text)


def held_reason(ev: Event | None) -> str | None:
    """The whole note if ``ev`` (a job's latest event) is a ``Note.HELD``, else None."""
    if ev is None or ev.attempt_id is not None or ev.from_state != ev.to_state:
        return None
    return ev.reason if ev.reason.startswith(Note.HELD) else None


# ------------------------------------------------------------------------------------------
# readers
# ------------------------------------------------------------------------------------------
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


def mermaid() -> str:
    """``docs/lifecycle.md``: both machines as mermaid state diagrams, generated from the edge data."""
    out = ["# Job and attempt lifecycle", "",
           "Generated by `python -m orchestrator.core.lifecycle --mermaid > docs/lifecycle.md` from the edge data in",
           "`orchestrator/core/lifecycle.py` (a test fails when this file is not current). Each arrow is labelled",
           "with the function that takes it; `[*]` arrows are the states a row may be created in.", ""]
    for title, births, edges in (("Job", JOB_BIRTHS, JOB_EDGES), ("Attempt", ATTEMPT_BIRTHS, ATTEMPT_EDGES)):
        out += [f"## {title}", "", "```mermaid", "stateDiagram-v2"]
        for b in births:
            out.append(f"    [*] --> {b.state.value}: {b.taker}")
        for e in edges:
            out.append(f"    {e.src.value} --> {e.dst.value}: {e.taker}")
        out += ["```", "", "| from | to | when | taken by |", "|---|---|---|---|"]
        out += [f"| (created) | `{b.state.value}` | {b.trigger} | `{b.taker}` |" for b in births]
        out += [f"| `{e.src.value}` | `{e.dst.value}` | {e.trigger.replace('|', '/')} | `{e.taker}` |"
                for e in edges]
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv != ["--mermaid"]:
        print("usage: python -m orchestrator.core.lifecycle --mermaid", file=sys.stderr)
        return 2
    sys.stdout.write(mermaid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
