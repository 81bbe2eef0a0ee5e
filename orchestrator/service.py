"""What the CLI commands do: submit, launch an attempt, requeue, cancel, gc.

Services never import click; they raise ``errors.*`` and the CLI maps them to exit codes.

Exactly-once submission: an attempt row (state ``pending``, unique token) is committed BEFORE the
backend call; the token travels with the job. A crash after the row and before the backend call,
or after the call and before the DB update, leaves a pending attempt that the reconciler resolves
by looking the token up (``Backend.find_by_token``) — it submits only if the backend has no trace.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from orchestrator import protocol
from orchestrator.backends.base import (
    AttemptRef,
    Backend,
    BackendError,
    Phase,
    Resources,
    SubmitSpec,
    get_backend,
)
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.errors import AlreadyVerified, DatabaseProblem, IllegalTransition, OrchError, Refused
from orchestrator.jobs import get_job, transition
from orchestrator.models import Attempt, Job, utcnow
from orchestrator.policy import command_for, dumps
from orchestrator.rundir import check_run_dir, empty_trash, move_to_trash, run_dir_for, unverified_leftovers
from orchestrator.states import AttemptState, JobState


def _fault(site: str) -> None:
    """Test hook: ``ORCH_FAULT=<site>`` makes this process die here, as a crash or kill -9 would."""
    if os.environ.get("ORCH_FAULT") == site:
        os._exit(99)


@dataclass
class SubmitRequest:
    name: str
    command: list[str]
    backend: str = "local"
    resources: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 3
    outputs: list[str] = field(default_factory=list)


def new_token() -> str:
    return secrets.token_hex(8)


def submit(db: Database, cfg: Config, req: SubmitRequest) -> Job:
    """Create the job and its first attempt, then hand it to the backend.

    Argument checks happened in the CLI before this is called. Here: filesystem checks (a verified
    marker refuses, a symlinked run dir refuses), then the DB row, then the backend.
    """
    run_dir = run_dir_for(cfg, req.name)
    check_run_dir(cfg, run_dir)
    v = protocol.verify_done_marker(run_dir)
    if v.verified:
        # The guard reads the one completion predicate, never "the directory is non-empty" (seed 000).
        raise AlreadyVerified(f"refused: {run_dir} holds a verified done marker; job {req.name!r} is finished")
    backend = get_backend(req.backend)
    with db.write() as s:
        existing = s.scalar(select(Job).where(Job.name == req.name))
        if existing is not None:
            raise Refused(f"refused: job {req.name!r} already exists ({existing.state}); "
                          f"use `orch requeue {req.name}` to run it again")
        job = Job(name=req.name, state=JobState.PENDING.value, backend=req.backend, run_dir=str(run_dir),
                  command_json=dumps(req.command), resources_json=dumps(req.resources),
                  outputs_json=dumps(req.outputs), max_attempts=req.max_attempts)
        s.add(job)
        s.flush()
        attempt = Attempt(job_id=job.id, n=1, token=new_token(), state=AttemptState.PENDING.value,
                          backend=req.backend)
        s.add(attempt)
    launch(db, cfg, job.name, backend)
    with db.read() as s:
        job = get_job(s, req.name)
        job.attempts  # noqa: B018 - load while the session is open; callers render it afterwards
        return job


def launch_grace_s() -> float:
    """How long a launcher's claim on a pending attempt holds (longer than sbatch's own timeout)."""
    try:
        return max(0.0, float(os.environ.get("ORCH_LAUNCH_GRACE_S", "120")))
    except ValueError:
        return 120.0


def _claim(db: Database, attempt_id: int) -> bool:
    """Compare-and-set claim of a pending attempt, so two launchers (a user's requeue and a cron
    pass) never both call the backend for it. ``submitted_at`` holds the claim while pending."""
    now = utcnow()
    with db.write() as s:
        res = s.execute(update(Attempt).where(
            Attempt.id == attempt_id, Attempt.state == AttemptState.PENDING.value,
            (Attempt.submitted_at.is_(None)) | (Attempt.submitted_at < now - timedelta(seconds=launch_grace_s())))
            .values(submitted_at=now))
        return res.rowcount == 1


def launch(db: Database, cfg: Config, name: str, backend: Backend | None = None) -> None:
    """Clear what the next attempt must not see, then submit the job's pending attempt.

    Claims the attempt first; callers that lose the claim return without doing anything. The
    reconciler re-launches an attempt only after ``find_by_token`` found nothing.
    """
    with db.read() as s:
        job = get_job(s, name)
        attempt = job.attempts[-1]
        if attempt.state != AttemptState.PENDING.value:
            return
        plan = attempt.plan
        argv, overrides = command_for(job, plan.get("one_shot", {}))
        run_dir = Path(job.run_dir)
        spec = SubmitSpec(job=job.name, attempt=attempt.n, token=attempt.token, run_dir=run_dir,
                          command=tuple(argv), outputs=tuple(job.outputs),
                          env={protocol.ENV_OVERRIDES: dumps(overrides)},
                          resources=_resources(job.resources))
        job_id, attempt_id = job.id, attempt.id
    if not _claim(db, attempt_id):
        return  # another process is launching this attempt right now
    backend = backend or get_backend(job.backend)
    check_run_dir(cfg, run_dir)
    if protocol.verify_done_marker(run_dir).verified:
        # A requeue raced a job that finished after all: never rerun a verified result.
        with db.write() as s:
            job = s.get(Job, job_id)
            a = s.get(Attempt, attempt_id)
            a.state = AttemptState.CANCELLED.value
            transition(s, job, JobState.DONE, "marker verified before launch")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        # A symlinked attempts/ or a glob through a symlinked dir would make orch write or move
        # things outside its runs root: refused, for this job only.
        protocol.resolve_inside(run_dir, f"{protocol.ATTEMPTS_DIR}/{spec.attempt}")
        move_to_trash(cfg, run_dir, unverified_leftovers(run_dir, job.outputs, plan.get("quarantine", [])), name)
        move_to_trash(cfg, run_dir, plan.get("prune", []), name)
        if plan.get("empty_trash"):
            empty_trash(cfg, name)
        if spec.attempt_dir.is_dir() and spec.token not in _attempt_tokens(spec.attempt_dir):
            # attempts/<n>/ left by an earlier run of this name (fresh DB, same runs root): its
            # failure.json would classify this new attempt (an old "invalid" failed it for good).
            move_to_trash(cfg, run_dir, [f"{protocol.ATTEMPTS_DIR}/{spec.attempt}"], name)
    except protocol.UnsafePath as e:
        raise Refused(f"refused: {name}: {e}") from None
    spec.attempt_dir.mkdir(parents=True, exist_ok=True)
    protocol.atomic_write_json(spec.attempt_dir / protocol.COMMAND_FILE, {
        "argv": argv, "overrides": overrides, "backend": backend.name, "token": spec.token,
        "resources": _resources_dict(spec.resources), "at": protocol.now_iso()})
    _fault("after_attempt_row")
    try:
        external_id = backend.submit(spec)
    except BackendError as e:
        with db.write() as s:
            a = s.get(Attempt, attempt_id)
            a.detail = f"submission failed: {e}"
            if e.permanent:
                # The scheduler will never take it (bad partition...): failed now, not retried forever.
                a.state, a.failure_class, a.ended_at = AttemptState.FAILED.value, "invalid", utcnow()
                a.action_json = dumps({"action": "give_up", "why": "the scheduler refused the submission"})
                transition(s, s.get(Job, job_id), JobState.FAILED, f"attempt {a.n}: {e}")
        if e.permanent:
            raise Refused(f"refused: {name}: {e}") from None
        raise OrchError(f"{name}: {e}") from None
    _fault("after_backend_submit")
    record_submitted(db, job_id, attempt_id, external_id, overrides)


def _attempt_tokens(adir: Path) -> set[str]:
    """Tokens recorded in an attempt dir by orch (command.json, before the backend call) and by its
    wrapper (wrapper.json, exit.json). A job may rewrite command.json (the trainer does), so no
    single file decides whose dir this is."""
    tokens = set()
    for fname in (protocol.COMMAND_FILE, "wrapper.json", protocol.EXIT_FILE):
        try:
            rec = protocol.read_json_bounded(adir / fname, limit=1 << 20)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("token"), str):
            tokens.add(rec["token"])
    return tokens


def record_submitted(db: Database, job_id: int, attempt_id: int, external_id: str,
                     overrides: dict[str, Any] | None = None) -> None:
    with db.write() as s:
        job = s.get(Job, job_id)
        a = s.get(Attempt, attempt_id)
        if a.state != AttemptState.PENDING.value:
            return
        a.external_id = external_id
        a.state = AttemptState.SUBMITTED.value
        a.submitted_at = utcnow()
        if overrides is not None:
            a.overrides_json = dumps(overrides)
        if job.state == JobState.PENDING.value:
            transition(s, job, JobState.SUBMITTED, f"attempt {a.n} submitted as {external_id}")


def _resources(r: dict[str, Any]) -> Resources:
    return Resources(partition=r.get("partition"), gpus=r.get("gpus"), cpus_per_task=r.get("cpus_per_task"),
                     mem_mb=r.get("mem_mb"), time_s=r.get("time_s"), account=r.get("account"),
                     extra_sbatch=tuple(r.get("extra_sbatch") or ()))


def _resources_dict(r: Resources) -> dict[str, Any]:
    return {k: v for k, v in r.__dict__.items() if v not in (None, ())}


# ------------------------------------------------------------------------------------------
# requeue
# ------------------------------------------------------------------------------------------
@dataclass
class RequeueResult:
    name: str
    outcome: str  # requeued | would_requeue | refused | skipped
    reason: str = ""
    attempt: int | None = None
    clears: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": self.outcome, "reason": self.reason, "attempt": self.attempt,
                "clears": self.clears}


REQUEUEABLE = frozenset({JobState.RETRYABLE_FAILED, JobState.FAILED, JobState.CANCELLED})


def requeue(db: Database, cfg: Config, names: list[str] | None, dry_run: bool = False,
            auto_only: bool = False) -> list[RequeueResult]:
    """Requeue the named jobs, or (names=None) every retryable_failed one.

    For each job the marker is verified FIRST: a verified job is never cleared or resubmitted.
    The state change to ``pending`` is a compare-and-set, so of several concurrent requeuers (cron
    reconcilers, a user) exactly one creates the next attempt.
    """
    with db.read() as s:
        if names is None:
            q = select(Job.name).where(Job.state == JobState.RETRYABLE_FAILED.value)
            targets = list(s.scalars(q))
        else:
            for n in names:
                get_job(s, n)  # unknown names fail before anything happens
            targets = list(names)
    results = []
    for name in targets:
        try:
            results.append(_requeue_one(db, cfg, name, dry_run, explicit=names is not None, auto_only=auto_only))
        except IllegalTransition:
            results.append(RequeueResult(name, "skipped", "another process requeued or changed it first"))
        except Refused as e:
            # One bad run dir (a symlink) is that job's refusal, not the whole pass's: raised, it
            # stopped `requeue --failed` and every reconcile pass's auto-requeue for all other jobs.
            results.append(RequeueResult(name, "refused", str(e)))
        except DatabaseProblem:
            raise  # the DB itself: every other job would fail the same way
        except Exception as e:  # noqa: BLE001 - e.g. a transient sbatch failure: this job only
            results.append(RequeueResult(name, "error", f"{type(e).__name__}: {str(e)[:300]}"))
    return results


def _requeue_one(db: Database, cfg: Config, name: str, dry_run: bool, explicit: bool,
                 auto_only: bool) -> RequeueResult:
    with db.read() as s:
        job = get_job(s, name)
        state = JobState(job.state)
        last = job.attempts[-1] if job.attempts else None
        run_dir = Path(job.run_dir)
        outputs = job.outputs
    if state is JobState.DONE:
        return RequeueResult(name, "refused", "verified: done_marker_verified jobs are never rerun")
    action = (last.action or {}) if last else {}
    if auto_only:
        # DB-only checks first: every reconcile pass walks all retryable_failed jobs, and verifying
        # a marker hashes every artifact.
        if not action.get("auto"):
            why = f"{last.failure_class if last else 'job'} waits for `orch requeue`"
            return RequeueResult(name, "skipped", why)
        nb = action.get("retry_not_before")
        if nb and nb > utcnow().isoformat():
            return RequeueResult(name, "skipped", f"backoff until {nb}")
    check_run_dir(cfg, run_dir)
    v = protocol.verify_done_marker(run_dir)
    if v.verified:
        if not dry_run:
            with db.write() as s:
                job = get_job(s, name)
                if JobState(job.state) is not JobState.DONE:
                    transition(s, job, JobState.DONE, "marker verified at requeue")
        return RequeueResult(name, "refused", "verified: its done marker verifies; never cleared or rerun")
    if state is JobState.CANCELLED and last is not None and last.external_id:
        # A cancelled attempt may still be checkpointing after its SIGTERM: a new attempt now would
        # run beside it in the same run dir, and launch would trash its in-flight files.
        ref = AttemptRef(last.external_id, last.token, run_dir, last.n)
        phase = get_backend(last.backend).poll([ref]).get(last.token)
        if phase is not None and phase.phase in (Phase.PENDING, Phase.RUNNING):
            return RequeueResult(name, "refused", f"attempt {last.n} ({last.external_id}) is still stopping; "
                                                  "try again when it has exited")
    if state not in REQUEUEABLE or (not explicit and state is not JobState.RETRYABLE_FAILED):
        return RequeueResult(name, "refused", f"job is {state.value}; only failed, retryable_failed or "
                                              "cancelled jobs can be requeued (cancel a live one first)")
    plan = dict(action.get("plan") or {})
    clears = unverified_leftovers(run_dir, outputs, plan.get("quarantine", []))
    clears += [p for p in plan.get("prune", []) if p not in clears]
    if dry_run:
        return RequeueResult(name, "would_requeue", action.get("action", "resume"),
                             (last.n + 1) if last else 1, clears)
    with db.write() as s:
        job = get_job(s, name)
        if JobState(job.state) is not state:
            raise IllegalTransition("changed")
        transition(s, job, JobState.PENDING, f"requeue ({action.get('action', 'manual')})")
        n = (max(a.n for a in job.attempts) + 1) if job.attempts else 1
        s.add(Attempt(job_id=job.id, n=n, token=new_token(), state=AttemptState.PENDING.value,
                      backend=job.backend, plan_json=dumps(plan) if plan else None))
    launch(db, cfg, name)
    return RequeueResult(name, "requeued", action.get("action", "resume"), n, clears)


# ------------------------------------------------------------------------------------------
# cancel, gc
# ------------------------------------------------------------------------------------------
def cancel(db: Database, cfg: Config, names: list[str]) -> list[tuple[str, str]]:
    out = []
    with db.read() as s:
        for n in names:
            get_job(s, n)
    for name in names:
        with db.write() as s:
            job = get_job(s, name)
            state = JobState(job.state)
            a = job.attempts[-1] if job.attempts else None
            if state in (JobState.DONE, JobState.CANCELLED, JobState.FAILED):
                out.append((name, f"not cancelled: job is {state.value}"))
                continue
            if a is not None and a.state in (AttemptState.SUBMITTED.value, AttemptState.RUNNING.value,
                                             AttemptState.PENDING.value):
                a.state = AttemptState.CANCELLED.value
                a.failure_class = "cancelled"
                a.ended_at = utcnow()
                ref = AttemptRef(a.external_id, a.token, Path(job.run_dir), a.n)
            else:
                ref = None
            transition(s, job, JobState.CANCELLED, "orch cancel")
            backend_name = job.backend
        if ref is not None and ref.external_id:
            try:
                get_backend(backend_name).cancel([ref])
            except BackendError as e:
                out.append((name, f"cancelled in orch, but the backend was not told ({e}); "
                                  f"stop {ref.external_id} by hand"))
                continue
        out.append((name, "cancelled"))
    return out


def gc(cfg: Config) -> int:
    return empty_trash(cfg)


__all__ = ["submit", "launch", "requeue", "cancel", "gc", "SubmitRequest", "RequeueResult"]
