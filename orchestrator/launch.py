"""Launching an attempt: claim it, prepare its run dir, hand it to the backend, record the id.

Exactly-once: the attempt row (state ``pending``, a unique token) is committed BEFORE any backend
call, and a launcher first claims it by compare-and-set (``pending -> launching``), so of two
launchers (a user's requeue and a cron pass) exactly one calls the backend. The token travels with
the job; a launcher that died inside the backend call leaves a ``launching`` attempt whose claim
expires, and the reconciler then asks the backend for the token before it launches again
(``reconcile``): it submits only if the backend answered that it has no trace.

Every way a launch can fail ends the attempt with a reason, so no job is left ``pending`` for ever
(issue 9): a refusal (a symlinked ``attempts/``, a scheduler that will never take the submission)
fails it ``invalid``; a filesystem error (ENOSPC, a file where a directory must be) fails it as a
retryable class; only a transient scheduler error keeps the claim, for the reconciler to retry.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import protocol, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, Backend, BackendError, Resources, SubmitSpec
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.errors import IllegalTransition, OrchError, Refused
from orchestrator.jobs import get_job
from orchestrator.lifecycle import (
    AttemptState,
    JobState,
    claim_expired,
    move_attempt,
    move_job,
    set_attempt_fields,
    utcnow,
)
from orchestrator.models import Attempt, Job
from orchestrator.observe import finish
from orchestrator.policy import command_for, is_bundled_trainer
from orchestrator.protocol import FailureClass
from orchestrator.rundir import check_run_dir, empty_trash, move_to_trash, unverified_leftovers

A, J = AttemptState, JobState
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def launch_grace_s() -> float:
    """How long a launcher's claim holds (longer than sbatch's own timeout)."""
    import os

    try:
        return max(0.0, float(os.environ.get("ORCH_LAUNCH_GRACE_S", "120")))
    except ValueError:
        return 120.0


@dataclass
class Launched:
    """What a launch did: the backend id (None when it did not reach the backend), what it trashed."""

    external_id: str | None = None
    moved: list[str] = field(default_factory=list)
    outcome: str = "submitted"  # submitted | lost_claim | verified | stopped


def _claim(db: Database, attempt_id: int, reclaim: bool) -> bool:
    """pending -> launching (or, ``reclaim``, an expired launching claim -> a new one)."""
    now = utcnow()
    try:
        with db.write() as s:
            a = s.get(Attempt, attempt_id)
            if a.state is A.PENDING:
                move_attempt(s, a, A.LAUNCHING, claimed_at=now)
            elif reclaim and a.state is A.LAUNCHING and claim_expired(a.claimed_at, now, launch_grace_s()):
                move_attempt(s, a, A.LAUNCHING, where=Attempt.claimed_at == a.claimed_at, claimed_at=now)
            else:
                return False
    except IllegalTransition:
        return False
    return True


def launch(db: Database, cfg: Config, name: str, backend: Backend | None = None, *,
           reclaim: bool = False) -> Launched:
    """Launch the job's pending attempt (``reclaim``: or its expired launching one).

    Raises Refused when the attempt was refused for good (the attempt and job are failed first),
    OrchError for a launch that failed (the attempt is ended with its class, or, for a transient
    scheduler error, left to the reconciler).
    """
    with db.read() as s:
        job = get_job(s, name)
        a = job.attempts[-1] if job.attempts else None
        if a is None or a.state not in (A.PENDING, A.LAUNCHING):
            return Launched(outcome="lost_claim")
        argv, overrides = command_for(job, a.plan)
        run_dir = Path(job.run_dir)
        spec = SubmitSpec(job=job.name, attempt=a.n, token=a.token, run_dir=run_dir, command=tuple(argv),
                          outputs=tuple(job.outputs), env={protocol.ENV_OVERRIDES: _dumps(overrides)},
                          resources=resources_of(job.resources),
                          warning_signal=job.resources.get("warning_signal")
                          or ("USR2" if is_bundled_trainer(argv) else "TERM"), umask=cfg.umask)
        job_id, attempt_id, plan, outputs = job.id, a.id, a.plan, list(job.outputs)
    if not _claim(db, attempt_id, reclaim):
        return Launched(outcome="lost_claim")  # another process is launching this attempt right now
    backend = backend or get_backend(job.backend)
    try:
        check_run_dir(cfg, run_dir)
        if protocol.verify_done_marker(run_dir).verified:
            _close_verified(db, attempt_id, job_id)
            return Launched(outcome="verified")
        moved = _prepare(cfg, spec, plan, outputs, backend.name)
    except (Refused, protocol.UnsafePath) as e:
        _fail(db, cfg, attempt_id, FailureClass.INVALID, f"refused: {e}")
        raise Refused(f"refused: {name}: {e}") from None
    except OSError as e:
        cls = FailureClass.ENOSPC if e.errno in _DISK_FULL else FailureClass.UNKNOWN
        _fail(db, cfg, attempt_id, cls, f"launch failed: {e}")
        raise OrchError(f"{name}: launch failed: {e.strerror or e}"
                        + (f": {e.filename}" if getattr(e, "filename", None) else "")) from None
    testhooks.site("before_backend_submit")
    if _cancelled_meanwhile(db, attempt_id):
        return Launched(moved=moved, outcome="stopped")  # orch cancel came first: start nothing
    try:
        external_id = backend.submit(spec)
    except BackendError as e:
        if e.permanent:
            # The scheduler will never take it (bad partition...): failed now, not retried forever.
            _fail(db, cfg, attempt_id, FailureClass.INVALID, f"the scheduler refused the submission: {e}")
            raise Refused(f"refused: {name}: {e}") from None
        with db.write() as s:  # transient: the claim stays; the reconciler looks the token up, then retries
            a = s.get(Attempt, attempt_id)
            if a.state is A.LAUNCHING:
                a.detail = f"submission failed (will be retried): {e}"[:2000]
        raise OrchError(f"{name}: {e}") from None
    except OSError as e:  # e.g. the batch script could not be written: nothing was submitted
        cls = FailureClass.ENOSPC if e.errno in _DISK_FULL else FailureClass.UNKNOWN
        _fail(db, cfg, attempt_id, cls, f"launch failed: {e}")
        raise OrchError(f"{name}: launch failed: {e.strerror or e}") from None
    testhooks.site("after_backend_submit")
    stopped = record_submitted(db, attempt_id, external_id, overrides, backend=backend)
    return Launched(external_id, moved, "stopped" if stopped else "submitted")


def _cancelled_meanwhile(db: Database, attempt_id: int) -> bool:
    """A cancel that landed while this launcher prepared the run dir: close the attempt unlaunched.
    (One that lands during the backend call itself is handled by ``record_submitted``.)"""
    with db.write() as s:
        a = s.get(Attempt, attempt_id)
        if a.state is not A.STOPPING:
            return False
        move_attempt(s, a, A.CANCELLED, failure_class=FailureClass.CANCELLED,
                     detail="cancelled during its launch, before the backend call")
    return True


def _close_verified(db: Database, attempt_id: int, job_id: int) -> None:
    """A requeue raced a job that finished after all: never rerun a verified result; the unlaunched
    attempt is closed too (issue 9: it stayed ``submitted`` for ever)."""
    with db.write() as s:
        a, job = s.get(Attempt, attempt_id), s.get(Job, job_id)
        if a.state in (A.LAUNCHING, A.STOPPING):
            move_attempt(s, a, A.CANCELLED, detail="not launched: the run dir's marker verifies")
        if job.state is not J.DONE:
            move_job(s, job, J.DONE, "marker verified before launch")


def _prepare(cfg: Config, spec: SubmitSpec, plan: Any, outputs: list[str], backend_name: str) -> list[str]:
    """Clear what the next attempt must not see, then write its command record."""
    run_dir = spec.run_dir
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_run_dir(cfg, run_dir)  # again: it may have been created as a symlink meanwhile
    # A symlinked attempts/ or a glob through a symlinked dir would make orch write or move things
    # outside its runs root: refused, for this job only.
    protocol.resolve_inside(run_dir, f"{protocol.ATTEMPTS_DIR}/{spec.attempt}")
    quarantine = plan.quarantine if plan else ()
    moved = move_to_trash(cfg, run_dir, unverified_leftovers(run_dir, outputs, quarantine), spec.job)
    moved += move_to_trash(cfg, run_dir, [p for p in (plan.prune if plan else ()) if p not in moved], spec.job)
    if plan is not None and plan.empty_trash:
        empty_trash(cfg, spec.job)
    if spec.attempt_dir.exists() and spec.token not in _attempt_tokens(spec.attempt_dir):
        # attempts/<n>/ left by an earlier run of this name (fresh DB, same runs root): its
        # failure.json would classify this new attempt (an old "invalid" failed it for good).
        moved += move_to_trash(cfg, run_dir, [f"{protocol.ATTEMPTS_DIR}/{spec.attempt}"], spec.job)
    spec.attempt_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    protocol.atomic_write_json(spec.attempt_dir / protocol.COMMAND_FILE, {
        "argv": list(spec.command), "overrides": _loads(spec.env.get(protocol.ENV_OVERRIDES)),
        "backend": backend_name, "token": spec.token, "resources": _resources_dict(spec.resources),
        "at": protocol.now_iso()})
    testhooks.site("after_attempt_row")
    return moved


def _attempt_tokens(adir: Path) -> set[str]:
    """Tokens recorded in an attempt dir by orch (command.json, before the backend call) and by its
    wrapper (wrapper.json, exit.json). A job may rewrite command.json (the trainer does), so no
    single file decides whose dir this is."""
    tokens = set()
    for fname in (protocol.COMMAND_FILE, protocol.WRAPPER_FILE, protocol.EXIT_FILE):
        try:
            rec = protocol.read_json_bounded(adir / fname, limit=1 << 20)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("token"), str):
            tokens.add(rec["token"])
    return tokens


def _fail(db: Database, cfg: Config, attempt_id: int, cls: FailureClass, detail: str) -> None:
    finish(db, cfg, attempt_id, None, launch_failure=(cls, detail))


def record_submitted(db: Database, attempt_id: int, external_id: str, overrides: dict[str, Any] | None = None,
                     *, backend: Backend | None = None) -> bool:
    """launching -> submitted with the backend's id (job pending -> submitted).

    If ``orch cancel`` overtook the launch (the attempt is already ``stopping``), the id is recorded
    and the new job stopped at once; returns True then (issue 9: a cancel that landed during the
    launch left the job running).
    """
    with db.write() as s:
        a = s.get(Attempt, attempt_id)
        job = s.get(Job, a.job_id)
        if a.state is A.LAUNCHING:
            extra = {"overrides": overrides} if overrides is not None else {}
            move_attempt(s, a, A.SUBMITTED, external_id=external_id, submitted_at=utcnow(), **extra)
            if job.state is J.PENDING:
                move_job(s, job, J.SUBMITTED, f"attempt {a.n} submitted as {external_id}")
            return False
        if a.state is not A.STOPPING or a.external_id is not None:
            return False
        set_attempt_fields(s, a, A.STOPPING, external_id=external_id, submitted_at=utcnow())
        ref = AttemptRef(external_id, a.token, Path(job.run_dir), a.n)
        backend_name = job.backend
    (backend or get_backend(backend_name)).cancel([ref])
    return True


def resources_of(r: dict[str, Any]) -> Resources:
    return Resources(partition=r.get("partition"), gpus=r.get("gpus"), cpus_per_task=r.get("cpus_per_task"),
                     mem_mb=r.get("mem_mb"), time_s=r.get("time_s"), account=r.get("account"),
                     extra_sbatch=tuple(r.get("extra_sbatch") or ()))


def _resources_dict(r: Resources) -> dict[str, Any]:
    return {k: v for k, v in r.__dict__.items() if v not in (None, ())}


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, sort_keys=True, default=str)


def _loads(s: str | None) -> Any:
    import json

    return json.loads(s) if s else {}
