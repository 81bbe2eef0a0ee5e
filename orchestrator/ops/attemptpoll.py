"""What the backends say about open attempts, turned into lifecycle moves.

``observe`` polls attempts (one backend call per backend) and applies each outcome: an attempt
seen running, requeued in place, hung (-> ``stopping``), still running past its stop grace (->
SIGKILL), or ended (-> ``ending.finish``, the one place an attempt ends).

A backend that cannot be asked yields UNKNOWN and changes nothing: a status query that timed out
must never fail or restart a healthy job (SkyPilot #10155).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import String, select, type_coerce

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.lifecycle import (
    ATTEMPT_POLLED,
    AttemptState,
    JobState,
    StopReason,
    move_attempt,
    move_job,
    set_attempt_fields,
    utcnow,
)
from orchestrator.core.models import Attempt, Job, open_attempt_term
from orchestrator.core.passchanges import Change, PassReport
from orchestrator.core.states import STOP_GRACE_S
from orchestrator.decide.staleness import Stale, judge
from orchestrator.errors import DatabaseProblem, IllegalTransition
from orchestrator.ops.attemptend import evidence_of_end, finish

A, J = AttemptState, JobState
HANG_KILL_GRACE_S = 30.0


@dataclass(frozen=True)
class Row:
    """What a pass knows of one polled attempt (one SELECT for all of them)."""

    id: int
    token: str
    external_id: str | None
    n: int
    run_dir: str
    backend: str
    state: AttemptState
    restarts: int
    job_state: JobState
    stop_reason: StopReason | None
    stop_requested_at: Any
    batch_token: str | None
    task_index: int | None
    runs: list[list[float | None]] | None = None
    rank_restarts: int = 0
    may_restart_ranks: bool = True  # the job's resources name --rank-restarts: only then is its record read

    @property
    def ref(self) -> AttemptRef:
        return AttemptRef(self.external_id, self.token, Path(self.run_dir), self.n, batch=self.batch_token,
                          task=self.task_index)


def polled_rows(db: Database, attempt_ids: list[int] | None = None) -> list[Row]:
    q = (select(Attempt.id, Attempt.token, Attempt.external_id, Attempt.n, Job.run_dir, Job.backend,
                Attempt.state, Attempt.restarts, Job.state.label("job_state"), Attempt.stop_reason,
                Attempt.stop_requested_at, Attempt.batch_token, Job.task_index, Attempt.runs,
                Attempt.rank_restarts, may_restart_ranks_term())
         .join(Job).where(open_attempt_term(), Attempt.state.in_(ATTEMPT_POLLED), Attempt.external_id.is_not(None)))
    if attempt_ids is not None:
        q = q.where(Attempt.id.in_(attempt_ids))
    with db.read() as s:
        return [Row(*r) for r in s.execute(q)]


def may_restart_ranks_term():  # a sqlalchemy column expression
    """Whether the job's stored resources name ``rank_restarts`` (set for ``--rank-restarts``, any value; absent
    otherwise: ``resources_dict`` stores set fields only). A LIKE on the row the pass already reads: reading every
    polled attempt's ``rank_restarts.json`` cost ~10 us each (100 ms of a 10,000-job pass, an ENOENT for nearly
    all of them). A false positive costs one read; the wrapper restarts ranks only for jobs that name it."""
    return type_coerce(Job.resources, String).contains('"rank_restarts"', autoescape=True).label("may_restart_ranks")


def observe(db: Database, cfg: Config, backend: Callable[[str], Backend], rows: list[Row],
            rep: PassReport) -> None:
    by_backend: dict[str, list[Row]] = {}
    for r in rows:
        by_backend.setdefault(r.backend, []).append(r)
    for name, items in by_backend.items():
        try:
            outcomes = backend(name).poll([r.ref for r in items])
        except Exception as e:  # the scheduler could not be asked: nothing changes
            rep.errors.append(f"{name} poll failed: {str(e)[:200]}")
            rep.query_failures += 1
            outcomes = {}
        rep.backend_calls += 1
        rep.polled += len(items)
        for r in items:
            out = outcomes.get(r.token) or Outcome(Phase.UNKNOWN, reason="backend did not answer")
            if out.phase is Phase.UNKNOWN and out.not_live and r.state is A.STOPPING \
                    and r.stop_reason is StopReason.CANCEL:
                # Cancelled before it started: Slurm drops a pending array task from its array and never accounts
                # it, and the attempt stayed `stopping` (its job `cancelled`) for good (hostile test). orch asked
                # for this end and the scheduler shows the job neither live nor accounted: it is over.
                out = replace(out, phase=Phase.VANISHED, reason="cancelled before it started (" + out.reason + ")")
            if out.phase is Phase.UNKNOWN:
                rep.unknown += 1
                if out.reason:
                    rep.undecided.append(f"{Path(r.run_dir).name}: {out.reason}")
                continue
            try:
                _apply(db, cfg, backend(name), r, out, rep)
            except IllegalTransition:
                pass  # another process moved this attempt or job first; its decision stands
            except DatabaseProblem:
                raise  # the DB itself (locked, corrupt): every other job would fail the same way
            except Exception as e:  # one job's surprise must not stall every other job
                rep.errors.append(f"{Path(r.run_dir).name}: {type(e).__name__}: {str(e)[:200]}")


def _apply(db: Database, cfg: Config, backend: Backend, r: Row, out: Outcome, rep: PassReport) -> None:
    if (runs := _new_runs(r, out)) is not None:
        with db.write() as s:  # before the end below: the finished attempt's hold is complete with it
            set_attempt_fields(s, s.get(Attempt, r.id), r.state, runs=runs)
    if (relaunches := _new_rank_restarts(r)) is not None:
        with db.write() as s:  # before the end below, as the runs: the wrapper wrote its last record before it exited
            set_attempt_fields(s, s.get(Attempt, r.id), r.state, rank_restarts=relaunches)
    if out.restart_causes and (out.phase in (Phase.EXITED, Phase.VANISHED) or out.restart_count > (r.restarts or 0)):
        _record_restart_causes(r.ref, out)
    if out.phase in (Phase.EXITED, Phase.VANISHED):
        finish(db, cfg, r.id, evidence_of_end(r.ref, out), rep)
        return
    if r.state is A.STOPPING:
        _escalate(cfg, backend, r, rep)
        return
    hung = _hung(cfg, r.ref) if out.phase is Phase.RUNNING else None
    if not hung and _unchanged(r, out):
        return
    with db.write() as s:
        a = s.get(Attempt, r.id)
        job = s.get(Job, a.job_id)
        if a.state is not r.state:
            return  # moved by someone else since the pass read it
        if out.restart_count > a.restarts:
            set_attempt_fields(s, a, a.state, restarts=out.restart_count)
        if out.phase is Phase.RUNNING:
            if a.state is A.SUBMITTED:
                move_attempt(s, a, A.RUNNING, started_at=a.started_at or utcnow())
            if job.state is J.SUBMITTED:
                move_job(s, job, J.RUNNING, f"attempt {a.n} running")
                rep.changed.append(Change(job.name, J.RUNNING))
            if hung:
                # Typed (migration 0010): classify, goodput and orch show read these columns; the
                # detail is only the human line (the rank once travelled in it as text, cut apart later).
                move_attempt(s, a, A.STOPPING, stop_reason=StopReason.HANG, stop_requested_at=utcnow(),
                             stale_rank=hung.rank, stale_step=hung.step, stale_age_s=round(hung.age_s, 3),
                             detail=hung.describe())
        elif a.state is A.RUNNING:  # pending again: Slurm requeued it in place
            move_attempt(s, a, A.SUBMITTED)
            if job.state is J.RUNNING:
                move_job(s, job, J.SUBMITTED, f"attempt {a.n} requeued in place by the scheduler")
                rep.changed.append(Change(job.name, J.SUBMITTED, "requeued in place"))
    if hung:
        # A hung process may never reach the point where it checks its SIGTERM flag: TERM first,
        # then (a later pass, _escalate) KILL.
        backend.cancel([r.ref])
        rep.changed.append(Change(Path(r.run_dir).name, A.STOPPING, StopReason.HANG))


MAX_RUNS_KEPT = protocol.MAX_RESTARTS_SHOWN + 1


def _new_runs(r: Row, out: Outcome) -> list[list[float | None]] | None:
    """The scheduler's per-run account of the attempt's hold when it differs from the one stored (a run began or
    ended), else None: a steady pass writes nothing. Only ever longer or more complete: an answer listing fewer
    runs than stored (accounting that lags after a controller restart) keeps what was learnt."""
    if not out.runs:
        return None
    new = [[start, end] for start, end in out.runs][:MAX_RUNS_KEPT]
    stored = r.runs if isinstance(r.runs, list) else []
    if len(new) < len(stored) or new == stored:
        return None
    return new


def _new_rank_restarts(r: Row) -> int | None:
    """How many rank restarts the wrapper recorded for the attempt, when more than stored, else None (a steady pass
    writes nothing). One small read per polled attempt of a job that names ``--rank-restarts`` (``may_restart_ranks``),
    none for the others. Only ever grows: a record deleted or garbled later does not take a counted restart back."""
    if not r.may_restart_ranks:
        return None
    seen = len(protocol.read_rank_restarts(r.ref.attempt_dir, r.token))
    return seen if seen > (r.rank_restarts or 0) else None


def _record_restart_causes(ref: AttemptRef, out: Outcome) -> None:
    """Keep the scheduler's cause of each earlier run of an attempt restarted in place, for ``orch show`` and
    the counts (protocol.restart_history): the program only saw a stop signal, and called a NODE_FAIL rerun a
    preemption. Written when a restart is first seen and at the end; a write that fails leaves the
    program's own records to decide, never a wrong class."""
    with contextlib.suppress(OSError):
        protocol.write_restart_causes(ref.attempt_dir, ref.token, [c.value if c else None for c in out.restart_causes])


def _unchanged(r: Row, out: Outcome) -> bool:
    """True when ``out`` would change nothing ``_apply`` writes: skip its write transaction.

    A steady pass over 10,000 running jobs otherwise took 10,000 BEGIN IMMEDIATE transactions that
    wrote nothing (bench P1: ~0.5 ms each, and each one holds the writer lock).
    """
    if out.restart_count > (r.restarts or 0):
        return False
    if out.phase is Phase.RUNNING:
        return r.state is A.RUNNING and r.job_state is not J.SUBMITTED
    return r.job_state is not J.RUNNING and r.state is not A.RUNNING  # PENDING


def _escalate(cfg: Config, backend: Backend, r: Row, rep: PassReport) -> None:
    """A stopping attempt that outlived its grace gets SIGKILL (every pass until it is gone)."""
    grace = min(HANG_KILL_GRACE_S, cfg.hang_timeout_s) if r.stop_reason is StopReason.HANG else STOP_GRACE_S
    if r.stop_requested_at is None or utcnow() - r.stop_requested_at >= timedelta(seconds=grace):
        backend.kill([r.ref])
        rep.changed.append(Change(Path(r.run_dir).name, A.STOPPING, f"{r.stop_reason}: SIGKILL"))


def _hung(cfg: Config, ref: AttemptRef) -> Stale | None:
    """The stale rank when some rank made no heartbeat progress for hang_timeout_s (staleness.judge: the rule
    ``orch status``'s hang flag shares), else None."""
    return judge(ref.run_dir, ref.attempt, cfg.hang_timeout_s, time.time())
