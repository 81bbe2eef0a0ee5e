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
from typing import Any, NoReturn

from orchestrator import protocol, resumestate, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import Backend, BackendError, SubmitSpec
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.errors import IllegalTransition, OrchError, Refused
from orchestrator.jobs import attempt_ref, get_job
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
from orchestrator.policy import command_for
from orchestrator.protocol import ENV_SWEEP, ENV_SWEEP_PARAMS, ENV_TASK_INDEX, FailureClass
from orchestrator.resources import resources_dict, resources_of
from orchestrator.resumestate import SET_ASIDE_KEY, TRASHED_KEY, keep_globs
from orchestrator.rundir import check_run_dir, empty_trash, leftovers_why, move_to_trash

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


@dataclass
class _Ready:
    """An attempt claimed by this launcher, its run dir prepared: what the backend call needs."""

    name: str
    job_id: int
    attempt_id: int
    env_id: int | None
    spec: SubmitSpec
    overrides: dict[str, Any]
    moved: list[str]


def _ready(db: Database, cfg: Config, name: str, backend_name: str | None, reclaim: bool) -> _Ready | Launched:
    """Read, claim, check and prepare the job's pending attempt (``reclaim``: its expired launching one).

    Returns a Launched when there is nothing to submit (another launcher has it; the marker verifies).
    Raises Refused / OrchError after ending the attempt with the reason.
    """
    with db.read() as s:
        job = get_job(s, name)
        a = job.attempts[-1] if job.attempts else None
        if a is None or a.state not in (A.PENDING, A.LAUNCHING):
            return Launched(outcome="lost_claim")
        argv, overrides = command_for(job, a.plan)
        env = {protocol.ENV_OVERRIDES: _dumps(overrides)}
        if job.sweep is not None and job.task_index is not None:
            env.update(sweep_env(job.sweep.name, job.task_index, job.sweep.params))
        spec = SubmitSpec(job=job.name, attempt=a.n, token=a.token, run_dir=Path(job.run_dir), command=tuple(argv),
                          outputs=tuple(job.outputs), env=env, resources=resources_of(job.resources),
                          warning_signal=job.resources.get("warning_signal") or "TERM", umask=cfg.umask,
                          task=job.task_index, base_env=job.environment.vars if job.environment else None,
                          spot_notice=job.resources.get("spot_notice") or cfg.spot_notice,
                          spot_url=cfg.spot_url, spot_interval_s=cfg.spot_interval_s)
        job_id, attempt_id, plan, outputs, env_id = job.id, a.id, a.plan, list(job.outputs), job.env_id
        keep = keep_globs(job.resources)
        backend_name = backend_name or job.backend
    if not _claim(db, attempt_id, reclaim):
        return Launched(outcome="lost_claim")  # another process is launching this attempt right now
    run_dir = spec.run_dir
    try:
        check_run_dir(cfg, run_dir)
        if protocol.verify_done_marker(run_dir).verified:
            _close_verified(db, attempt_id, job_id)
            return Launched(outcome="verified")
        moved = _prepare(cfg, spec, plan, outputs, backend_name, keep)
    except (Refused, protocol.UnsafePath) as e:
        _fail(db, cfg, attempt_id, FailureClass.INVALID, f"refused: {e}")
        raise Refused(f"refused: {name}: {e}") from None
    except OSError as e:
        cls = FailureClass.ENOSPC if e.errno in _DISK_FULL else FailureClass.UNKNOWN
        _fail(db, cfg, attempt_id, cls, f"launch failed: {e}")
        raise OrchError(f"{name}: launch failed: {e.strerror or e}"
                        + (f": {e.filename}" if getattr(e, "filename", None) else "")) from None
    return _Ready(name, job_id, attempt_id, env_id, spec, overrides, moved)


def launch(db: Database, cfg: Config, name: str, backend: Backend | None = None, *,
           reclaim: bool = False) -> Launched:
    """Launch the job's pending attempt (``reclaim``: or its expired launching one).

    Raises Refused when the attempt was refused for good (the attempt and job are failed first),
    OrchError for a launch that failed (the attempt is ended with its class, or, for a transient
    scheduler error, left to the reconciler).
    """
    r = _ready(db, cfg, name, backend.name if backend else None, reclaim)
    if isinstance(r, Launched):
        return r
    if backend is None:
        with db.read() as s:
            backend = get_backend(s.get(Job, r.job_id).backend)
    testhooks.site("before_backend_submit")
    if _cancelled_meanwhile(db, r.attempt_id):
        return Launched(moved=r.moved, outcome="stopped")  # orch cancel came first: start nothing
    try:
        external_id = backend.submit(r.spec)
    except (BackendError, OSError) as e:
        _submission_failed(db, cfg, [r], e)
    testhooks.site("after_backend_submit")
    stopped = record_submitted(db, r.attempt_id, external_id, r.overrides, backend=backend)
    return Launched(external_id, r.moved, "stopped" if stopped else "submitted")


def launch_group(db: Database, cfg: Config, names: list[str], backend: Backend, throttle: int | None, *,
                 reclaim: bool = False) -> dict[str, Launched | OrchError]:
    """Launch the pending attempts of several sweep tasks as ONE group submission per set of equal
    resources (a Slurm array: one sbatch, not one per task). Per name: what happened, or the error.

    Each attempt is claimed and prepared on its own (a task whose run dir is refused fails alone);
    the group's token is recorded on every member before the backend call, so a crash inside it is
    resolved by the reconciler for the whole array at once (``find_by_token`` of the batch token).
    """
    results: dict[str, Launched | OrchError] = {}
    ready: list[_Ready] = []
    for name in names:
        try:
            r = _ready(db, cfg, name, backend.name, reclaim)
        except OrchError as e:
            results[name] = e
            continue
        if isinstance(r, Launched):
            results[name] = r
        else:
            ready.append(r)
    testhooks.site("before_backend_submit")
    groups: dict[tuple, list[_Ready]] = {}
    for r in ready:
        if _cancelled_meanwhile(db, r.attempt_id):
            results[r.name] = Launched(moved=r.moved, outcome="stopped")
        else:
            groups.setdefault((r.spec.resources, r.spec.warning_signal, r.env_id), []).append(r)
    for members in groups.values():
        batch = new_batch_token()
        members = [r for r in members if _mark_batch(db, r.attempt_id, batch)]
        try:
            ids = backend.submit_group([r.spec for r in members], batch, throttle)
        except (BackendError, OSError) as e:
            try:
                _submission_failed(db, cfg, members, e)
            except OrchError as err:
                for r in members:
                    results[r.name] = err
            continue
        testhooks.site("after_backend_submit")
        for r in members:
            stopped = record_submitted(db, r.attempt_id, ids[r.spec.token], r.overrides, backend=backend)
            results[r.name] = Launched(ids[r.spec.token], r.moved, "stopped" if stopped else "submitted")
    return results


def _mark_batch(db: Database, attempt_id: int, batch: str) -> bool:
    with db.write() as s:
        return set_attempt_fields(s, s.get(Attempt, attempt_id), A.LAUNCHING, batch_token=batch)


def _submission_failed(db: Database, cfg: Config, members: list[_Ready], e: Exception) -> NoReturn:
    """The backend call failed for these attempts: raise, after recording what the failure means."""
    names = ", ".join(r.name for r in members)
    if isinstance(e, BackendError) and e.permanent:
        # The scheduler will never take it (bad partition...): failed now, not retried forever.
        for r in members:
            _fail(db, cfg, r.attempt_id, FailureClass.INVALID, f"the scheduler refused the submission: {e}")
        raise Refused(f"refused: {names}: {e}") from None
    if isinstance(e, BackendError):
        with db.write() as s:  # transient: the claim stays; the reconciler looks the token up, then retries
            for r in members:
                a = s.get(Attempt, r.attempt_id)
                if a.state is A.LAUNCHING:
                    a.detail = f"submission failed (will be retried): {e}"[:2000]
        raise OrchError(f"{names}: {e}") from None
    # An OSError before the scheduler was asked (the batch script could not be written): nothing
    # was submitted.
    cls = FailureClass.ENOSPC if getattr(e, "errno", None) in _DISK_FULL else FailureClass.UNKNOWN
    for r in members:
        _fail(db, cfg, r.attempt_id, cls, f"launch failed: {e}")
    raise OrchError(f"{names}: launch failed: {getattr(e, 'strerror', None) or e}") from None


def new_batch_token() -> str:
    import secrets

    return "b" + secrets.token_hex(8)


def sweep_env(sweep: str, index: int, params: list[dict[str, Any]]) -> dict[str, str]:
    """What a sweep task gets besides ORCH_*: its sweep, its index and its argument set (JSON)."""
    return {ENV_SWEEP: sweep, ENV_TASK_INDEX: str(index),
            ENV_SWEEP_PARAMS: _dumps(params[index] if 0 <= index < len(params) else {})}


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


def _prepare(cfg: Config, spec: SubmitSpec, plan: Any, outputs: list[str], backend_name: str,
             keep: list[str] | None = None) -> list[str]:
    """Set torn checkpoints aside, clear what the next attempt must not see (never its resume state),
    then write its command record, which names what went to the trash and why (``orch show``)."""
    run_dir = spec.run_dir
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_run_dir(cfg, run_dir)  # again: it may have been created as a symlink meanwhile
    # A symlinked attempts/ or a glob through a symlinked dir would make orch write or move things
    # outside its runs root: refused, for this job only.
    protocol.resolve_inside(run_dir, f"{protocol.ATTEMPTS_DIR}/{spec.attempt}")
    keep = keep or []
    # Issue 17: a kill -9 mid-save left a checkpoint every next attempt crashed on: renamed, never deleted.
    set_aside = resumestate.set_aside_torn(run_dir, keep)
    quarantine = plan.quarantine if plan else ()
    why = dict(leftovers_why(run_dir, outputs, quarantine, keep))
    moved = move_to_trash(cfg, run_dir, list(why), spec.job)
    pruned = [p for p in (plan.prune if plan else ()) if p not in moved]
    moved += move_to_trash(cfg, run_dir, pruned, spec.job)
    why.update({p: "pruned by the policy (disk full)" for p in pruned})
    if plan is not None and plan.empty_trash:
        empty_trash(cfg, spec.job)
    if spec.attempt_dir.exists() and spec.token not in _attempt_tokens(spec.attempt_dir):
        # attempts/<n>/ left by an earlier run of this name (fresh DB, same runs root): its
        # failure.json would classify this new attempt (an old "invalid" failed it for good).
        rel = f"{protocol.ATTEMPTS_DIR}/{spec.attempt}"
        moved += move_to_trash(cfg, run_dir, [rel], spec.job)
        why[rel] = "an attempt dir of an earlier run of this name"
    spec.attempt_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    protocol.atomic_write_json(spec.attempt_dir / protocol.COMMAND_FILE, {
        "argv": list(spec.command), "overrides": _loads(spec.env.get(protocol.ENV_OVERRIDES)),
        "backend": backend_name, "token": spec.token, "resources": resources_dict(spec.resources),
        "at": protocol.now_iso(),
        TRASHED_KEY: [{"path": p, "why": why.get(p, "")} for p in moved],
        SET_ASIDE_KEY: [x.as_dict() for x in set_aside]})
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
        ref = attempt_ref(a, job, external_id)
        backend_name = job.backend
    (backend or get_backend(backend_name)).cancel([ref])
    return True


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, sort_keys=True, default=str)


def _loads(s: str | None) -> Any:
    import json

    return json.loads(s) if s else {}
