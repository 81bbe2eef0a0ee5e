"""The one place an attempt ends: the marker decides done; otherwise classify, ask the policy, and record both.

``finish`` moves the attempt and its job by compare-and-set (a concurrent finisher makes it a no-op). The
reconciler's poll (``observe``), ``orch requeue`` (which settles a stopping attempt before it decides) and a
failed launch all end attempts through it. ``evidence_of_end`` gathers what the run dir and the backend say
about an attempt that ended, without the DB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from orchestrator import protocol, testhooks
from orchestrator.backends.base import AttemptRef, Outcome
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.lifecycle import AttemptState, JobState, move_attempt, move_job
from orchestrator.core.models import Attempt, Job
from orchestrator.core.passchanges import Change, PassReport
from orchestrator.core.retryplan import Action, RetryPlan
from orchestrator.decide.classify import classify
from orchestrator.decide.policy import decide
from orchestrator.decide.staleness import Stale
from orchestrator.jobside import rankend
from orchestrator.jobside.ballast import give_back
from orchestrator.protocol import FailureClass

A, J = AttemptState, JobState


@dataclass(frozen=True)
class Evidence:
    """Everything read from the run dir and the backend about an attempt that ended (no DB)."""

    verification: protocol.Verification
    report: protocol.FailureReport | None
    outcome: Outcome
    exit_record: protocol.ExitRecord | None
    stop: protocol.StopRecord | None = None  # the program's kit received a stop signal (stop.json)
    # (rank, its returncode): the rank whose program ended first on its own, from the per-rank records when the
    # wrapper left no exit.json (a stop's SIGKILL took it; classify.py's hang stop that found a dead rank).
    rank_end: tuple[int, int] | None = None


def evidence_of_end(ref: AttemptRef, out: Outcome) -> Evidence:
    verification = protocol.verify_done_marker(ref.run_dir)
    report = None if verification.verified else protocol.read_failure_report(ref.run_dir, ref.attempt)
    rec = protocol.read_exit(ref.attempt_dir, ref.token)
    if rec is not None and rec.returncode is not None:
        # The wrapper's own record is exact; sacct reports exit 143 as 15 (it drops the 128).
        rc = rec.returncode
        out = replace(out, exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else out.signal)
    stop = None if verification.verified else protocol.read_stop(ref.attempt_dir, ref.token)
    rank_end = None if verification.verified else _own_rank_end(ref, rec)
    return Evidence(verification, report, out, rec, stop, rank_end)


def _own_rank_end(ref: AttemptRef, rec: protocol.ExitRecord | None) -> tuple[int, int] | None:
    """The exit record's failed rank, or without one the per-rank records of the launch wrapper.json names (its
    token checked): hostile pass 4's rank 1 kill -9'd before its first heartbeat left only those, the hang stop's
    SIGKILL having taken the wrapper before it wrote exit.json."""
    if rec is not None:
        return None if rec.failed_rank is None or rec.rank_returncode is None else (rec.failed_rank,
                                                                                   rec.rank_returncode)
    try:
        w = protocol.read_json_bounded(ref.attempt_dir / protocol.WRAPPER_FILE, limit=1 << 16)
    except (OSError, ValueError):
        return None
    if not isinstance(w, dict) or w.get("token") != ref.token:
        return None
    launch, world = w.get("launch"), w.get("world_size")
    if not isinstance(launch, str) or not protocol.is_int(world, 1, 1 << 20):
        return None
    ends = rankend.read_rank_ends(ref.attempt_dir / rankend.TORCHRUN_DIR, launch, ref.token, world)
    end = rankend.first_own_end(ends, world)
    return None if end is None else (end.rank, end.returncode)


def _restarts_at_end(seen: int, ev: Evidence | None) -> int:
    """In-place restarts of an attempt, from what proves one happened: sacct's records of the id (one per
    run) and the SLURM_RESTART_COUNT the wrapper's last run recorded. A count seen while the job ran
    (``seen``) is a guess made in the requeue window: a sweep task that sacct had COMPLETED kept
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
    _release_batch_slot(job, a)
    restarts = _restarts_at_end(a.restarts, ev)
    common: dict[str, Any] = {"restarts": restarts}
    if ev is not None:
        out = ev.outcome
        common["exit_code"] = out.exit_code if out.exit_code is not None else (-out.signal if out.signal else None)
        if out.backend_state:
            common["backend_state"] = out.backend_state[:64]
        if ev.exit_record is not None:  # where it ran: the wrapper's record of its last run
            common["world_size"], common["nodes"] = ev.exit_record.world_size, ev.exit_record.nodes
        if not common.get("nodes") and out.nodes:  # no exit record (a node that failed took the wrapper with
            common["nodes"] = out.nodes  # it): the scheduler's node list, so suspect nodes see it
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
                     exit_record=ev.exit_record, stop_record=ev.stop, hang=_stale_of(a), rank_end=ev.rank_end)
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


def _release_batch_slot(job: Job, a: Attempt) -> None:
    """The room its group launch held for the attempt's ballast (``launchprep.BatchRecords``), given back: a
    task that never started never took it (a wrapper that started gave it back then)."""
    if a.batch_token and job.task_index is not None:
        give_back(Path(job.run_dir), a.batch_token, job.task_index)


def _stale_of(a: Attempt) -> Stale | None:
    """The hang stop's typed record observe wrote on the attempt (None: it was never stopped as hung)."""
    return Stale(a.stale_rank, a.stale_age_s, a.stale_step) if a.stale_age_s is not None else None


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
