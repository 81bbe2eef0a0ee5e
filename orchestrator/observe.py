"""What the backends say about open attempts, turned into lifecycle moves.

``observe`` polls attempts (one backend call per backend) and applies each outcome: an attempt
seen running, requeued in place, hung (-> ``stopping``), still running past its stop grace (->
SIGKILL), or ended (-> ``finish``). ``finish`` is the one place an attempt ends: the marker decides
done; otherwise classify, ask the policy, and record both, moving attempt and job by
compare-and-set. The reconciler, ``orch requeue`` (which settles a stopping attempt before it
decides) and a failed launch all end attempts through it.

A backend that cannot be asked yields UNKNOWN and changes nothing: a status query that timed out
must never fail or restart a healthy job (SkyPilot #10155).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from orchestrator import protocol, testhooks
from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase
from orchestrator.classify import classify
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.errors import DatabaseProblem, IllegalTransition
from orchestrator.lifecycle import (
    ATTEMPT_POLLED,
    AttemptState,
    JobState,
    StopReason,
    move_attempt,
    move_job,
    set_attempt_fields,
    utcnow,
)
from orchestrator.models import Attempt, Job
from orchestrator.plan import Action, RetryPlan
from orchestrator.policy import decide
from orchestrator.protocol import FailureClass

A, J = AttemptState, JobState
STOP_GRACE_S = 60.0  # SIGTERM -> SIGKILL for orch cancel (Slurm's own KillWait usually acts first)
HANG_KILL_GRACE_S = 30.0


@dataclass(frozen=True)
class Change:
    """One thing a pass changed, as ``orch reconcile`` prints it (``--json``: the keys it always had)."""

    name: str
    to: JobState | AttemptState
    why: str | None = None
    cls: FailureClass | None = None
    action: Action | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "to": self.to.value}
        for key, v in (("class", self.cls), ("action", self.action), ("why", self.why)):
            if v:
                d[key] = str(v)
        return d


@dataclass
class PassReport:
    ran: bool = True
    polled: int = 0
    backend_calls: int = 0
    changed: list[Change] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    unknown: int = 0
    undecided: list[str] = field(default_factory=list)  # "<job>: <why>" for each unknown with a reason
    errors: list[str] = field(default_factory=list)
    query_failures: int = 0  # scheduler queries (poll, find by token) that could not be answered
    duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "changed": [c.as_dict() for c in self.changed]}


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

    @property
    def ref(self) -> AttemptRef:
        return AttemptRef(self.external_id, self.token, Path(self.run_dir), self.n, batch=self.batch_token,
                          task=self.task_index)


def polled_rows(db: Database, attempt_ids: list[int] | None = None) -> list[Row]:
    q = (select(Attempt.id, Attempt.token, Attempt.external_id, Attempt.n, Job.run_dir, Job.backend,
                Attempt.state, Attempt.restarts, Job.state.label("job_state"), Attempt.stop_reason,
                Attempt.stop_requested_at, Attempt.batch_token, Job.task_index)
         .join(Job).where(Attempt.state.in_(ATTEMPT_POLLED), Attempt.external_id.is_not(None)))
    if attempt_ids is not None:
        q = q.where(Attempt.id.in_(attempt_ids))
    with db.read() as s:
        return [Row(*r) for r in s.execute(q)]


def observe(db: Database, cfg: Config, backend: Callable[[str], Backend], rows: list[Row],
            rep: PassReport) -> None:
    by_backend: dict[str, list[Row]] = {}
    for r in rows:
        by_backend.setdefault(r.backend, []).append(r)
    for name, items in by_backend.items():
        try:
            outcomes = backend(name).poll([r.ref for r in items])
        except Exception as e:  # noqa: BLE001 - the scheduler could not be asked: nothing changes
            rep.errors.append(f"{name} poll failed: {str(e)[:200]}")
            rep.query_failures += 1
            outcomes = {}
        rep.backend_calls += 1
        rep.polled += len(items)
        for r in items:
            out = outcomes.get(r.token) or Outcome(Phase.UNKNOWN, reason="backend did not answer")
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
            except Exception as e:  # noqa: BLE001 - one job's surprise must not stall every other job
                rep.errors.append(f"{Path(r.run_dir).name}: {type(e).__name__}: {str(e)[:200]}")


def _apply(db: Database, cfg: Config, backend: Backend, r: Row, out: Outcome, rep: PassReport) -> None:
    if out.restart_causes and (out.phase in (Phase.EXITED, Phase.VANISHED) or out.restart_count > (r.restarts or 0)):
        _record_restart_causes(r.ref, out)
    if out.phase in (Phase.EXITED, Phase.VANISHED):
        finish(db, cfg, r.id, evidence_of_end(r, out), rep)
        return
    if r.state is A.STOPPING:
        _escalate(cfg, backend, r, rep)
        return
    hung = out.phase is Phase.RUNNING and _hung(cfg, r.ref)
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
                move_attempt(s, a, A.STOPPING, stop_reason=StopReason.HANG, stop_requested_at=utcnow(),
                             detail=f"no heartbeat for {cfg.hang_timeout_s:.0f}s; stopping it")
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


def _record_restart_causes(ref: AttemptRef, out: Outcome) -> None:
    """Keep the scheduler's cause of each earlier run of an attempt restarted in place, for ``orch show`` and
    the counts (protocol.restart_history): the program only saw a stop signal, and called a NODE_FAIL rerun a
    preemption (issue 18). Written when a restart is first seen and at the end; a write that fails leaves the
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


def _hung(cfg: Config, ref: AttemptRef) -> bool:
    """No heartbeat progress for hang_timeout_s. Jobs that never write a heartbeat are not judged."""
    if not protocol.read_progress(ref.run_dir, ref.attempt):
        return False
    now = time.time()
    # When the heartbeat was last written, by the file's mtime: the filesystem's clock, not the "time"
    # the job writes. A node whose clock ran 60 s behind had a healthy job stopped as hung on every
    # attempt until it failed for good, and a heartbeat without "time" was never judged (hostile test).
    beat = _seen_at(ref.attempt_dir / protocol.PROGRESS_FILE, now)
    if beat is None:
        return False
    # A Slurm in-place requeue restarts the wrapper (rewriting wrapper.json) long after the last
    # heartbeat of the previous run: count from the later of the two.
    started = _seen_at(ref.attempt_dir / protocol.WRAPPER_FILE, now) or 0.0
    return now - max(beat, started) > cfg.hang_timeout_s


FUTURE_SKEW_S = 60.0  # an mtime this far ahead of our clock is a clock error (or a forgery), not news


def _seen_at(path: Path, now: float) -> float | None:
    """The time ``path`` was last written, for judging a hang; None when it cannot be read.

    A heartbeat dated in the future (a node clock ahead, `touch -d`) counted as fresh for ever, so a hung
    job was never stopped. Such an mtime is re-dated to ``now``, the first pass that saw it: the file
    itself keeps when orch first saw that heartbeat, with no DB column and nothing beside it. A job that
    still writes puts a new (future) mtime there, which the next pass re-dates again: it stays fresh, as it
    should; a job that stopped writing keeps the re-dated time and is judged hung hang_timeout_s later. A
    rename racing the re-dating only dates a just-written heartbeat to now: still fresh. If the time cannot
    be set, ``now`` is used for this pass (fresh), as before the re-dating existed.
    """
    try:
        mtime = os.lstat(path).st_mtime
    except OSError:
        return None
    if mtime <= now + FUTURE_SKEW_S:
        return mtime
    with contextlib.suppress(OSError):
        os.utime(path, (now, now), follow_symlinks=False)
    return now


# ------------------------------------------------------------------------------------------
# the end of an attempt
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """Everything read from the run dir and the backend about an attempt that ended (no DB)."""

    verification: protocol.Verification
    report: protocol.FailureReport | None
    outcome: Outcome
    exit_record: protocol.ExitRecord | None
    stop: protocol.StopRecord | None = None  # the program's kit received a stop signal (stop.json)


def evidence_of_end(r: Row, out: Outcome) -> Evidence:
    ref = r.ref
    verification = protocol.verify_done_marker(ref.run_dir)
    report = None if verification.verified else protocol.read_failure_report(ref.run_dir, ref.attempt)
    rec = protocol.read_exit(ref.attempt_dir, ref.token)
    if rec is not None and rec.returncode is not None:
        # The wrapper's own record is exact; sacct reports exit 143 as 15 (it drops the 128).
        rc = rec.returncode
        out = replace(out, exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else out.signal)
    stop = None if verification.verified else protocol.read_stop(ref.attempt_dir, ref.token)
    return Evidence(verification, report, out, rec, stop)


def _restarts_at_end(seen: int, ev: Evidence | None) -> int:
    """In-place restarts of an attempt, from what proves one happened: sacct's records of the id (one per
    run) and the SLURM_RESTART_COUNT the wrapper's last run recorded. A count seen while the job ran
    (``seen``) is a guess made in the requeue window: issue 17's sweep task that sacct had COMPLETED kept
    restarts=1 because a prio job arrived as it finished."""
    if ev is None:
        return seen
    if ev.exit_record is not None:
        return max(ev.outcome.restart_count, ev.exit_record.restart_count)
    return max(seen, ev.outcome.restart_count)  # no record of the last run: the running count stands


def finish(db: Database, cfg: Config, attempt_id: int, ev: Evidence | None, rep: PassReport | None = None,
           *, launch_failure: tuple[FailureClass, str] | None = None) -> None:
    """End an attempt: SUCCEEDED if the marker verifies, else classified and decided by policy.

    ``launch_failure``: (class, detail) of an attempt that never reached the backend. The policy
    runs outside the write transaction (it may hash checkpoints); the writes are compare-and-set on
    the state read here, so a concurrent finisher makes this one a no-op.
    """
    with db.read() as s:
        a = s.scalar(select(Attempt).where(Attempt.id == attempt_id)
                     .options(selectinload(Attempt.job).selectinload(Job.attempts)))
        if a is None or a.state not in (A.SUBMITTED, A.RUNNING, A.STOPPING, A.LAUNCHING):
            return
        job, seen = a.job, a.state
    restarts = _restarts_at_end(a.restarts, ev)
    common: dict[str, Any] = {"restarts": restarts}
    if ev is not None:
        out = ev.outcome
        common["exit_code"] = out.exit_code if out.exit_code is not None else (-out.signal if out.signal else None)
        if out.backend_state:
            common["backend_state"] = out.backend_state[:64]
        if ev.exit_record is not None:  # where it ran (issue 19): the wrapper's record of its last run
            common["world_size"], common["nodes"] = ev.exit_record.world_size, ev.exit_record.nodes
        if not common.get("nodes") and out.nodes:  # no exit record (a node that failed took the wrapper with
            common["nodes"] = out.nodes  # it): the scheduler's node list, so suspect nodes see it (issue 20)
    if ev is not None and ev.verification.verified:
        with db.write() as s:
            a, job = s.get(Attempt, attempt_id), s.get(Job, job.id)
            move_attempt(s, a, A.SUCCEEDED, expect=seen, why="marker verified", **common)
            testhooks.site("recording_success")
            if job.state is not J.DONE:
                move_job(s, job, J.DONE, f"attempt {a.n}: marker verified")
        _note(rep, job.name, J.DONE)
        return
    if launch_failure is not None:
        cls, step, detail = launch_failure[0], None, launch_failure[1]
    else:
        c = classify(ev.outcome, ev.report, ev.verification, stop_reason=a.stop_reason,
                     exit_record=ev.exit_record, stop_record=ev.stop)
        cls, step, detail = c.cls, c.step, c.detail
    d = decide(cfg, job, a, cls, step, ev.report if ev else None, never_launched=launch_failure is not None)
    plan = d.plan
    if d.cls is not None:  # the policy proved more than this attempt shows (no_progress; invalid after N)
        detail, cls = f"{cls.value}: {detail}", d.cls
    with db.write() as s:
        a, job = s.get(Attempt, attempt_id), s.get(Job, job.id)
        end = A.CANCELLED if cls is FailureClass.CANCELLED else A.FAILED
        move_attempt(s, a, end, expect=seen, why=f"{cls.value}: {detail}", failure_class=cls, failure_step=step,
                     detail=detail[:2000], counted=d.counted, action=plan, **common)
        target = d.state
        if job.state in (J.CANCELLED, J.DONE, target):
            _note(rep, job.name, job.state, cls, plan.action)
            return  # orch cancel already settled the job (its attempt has now stopped)
        carried = _carried(job, plan) if target is J.RETRYABLE_FAILED else {}
        move_job(s, job, target, f"attempt {a.n}: {cls.value} ({detail[:200]}) -> {plan.action}", **carried)
    _note(rep, job.name, target, cls, plan.action)


def _carried(job: Job, plan: RetryPlan) -> dict[str, Any]:
    """What the plan changes for every later attempt, and whether the reconciler requeues by itself: written
    in the job's move (one guarded UPDATE), never as ORM attributes flushed beside it."""
    out: dict[str, Any] = {"auto_requeue": plan.auto, "retry_not_before": plan.not_before}
    if plan.overrides:
        out["overrides"] = {**job.overrides, **plan.overrides_dict}
    if plan.resources:
        out["resources"] = {**job.resources, **plan.resources_dict}
    return out


def _note(rep: PassReport | None, name: str, to: JobState, cls: FailureClass | None = None,
          action: Action | None = None) -> None:
    if rep is not None:
        rep.changed.append(Change(name, to, cls=cls, action=action))
