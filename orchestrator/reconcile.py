"""One reconciler pass (cron runs ``orch reconcile`` every minute; ``--watch`` loops).

A pass: take the lease (a second overlapping pass exits quietly), resolve attempts whose submission
a crash left in doubt (by token), poll every live attempt with ONE backend call per backend, verify
the markers of those that ended, classify, decide by policy, transition by compare-and-set, stop
hung jobs, and requeue what the policy requeues by itself.

A pass reads only live and pending attempts (an index on attempts.state), so its cost does not
grow with history. A backend that cannot be asked yields UNKNOWN and changes nothing: a status
query that timed out must never fail or restart a healthy job (SkyPilot #10155).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import selectinload

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, BackendError, Outcome, Phase, get_backend
from orchestrator.classify import classify
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.errors import DatabaseProblem, IllegalTransition, OrchError
from orchestrator.jobs import transition
from orchestrator.models import Attempt, Job, Lease, utcnow
from orchestrator.policy import decide, dumps
from orchestrator.service import launch, launch_grace_s, record_submitted, requeue
from orchestrator.states import AttemptState, JobState
from orchestrator.wrapper import WRAPPER_FILE, read_exit

LEASE = "reconcile"
HANG_KILL_GRACE_S = 30.0


@dataclass
class PassReport:
    ran: bool = True
    polled: int = 0
    backend_calls: int = 0
    changed: list[dict[str, Any]] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    unknown: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def acquire_lease(db: Database, cfg: Config, holder: str) -> bool:
    """Take the named lease if it is free or expired. Works on SQLite and any SQL DB."""
    now = utcnow()
    with db.write() as s:
        res = s.execute(update(Lease).where(Lease.name == LEASE, (Lease.expires_at < now) | (Lease.holder == holder))
                        .values(holder=holder, expires_at=now + timedelta(seconds=cfg.lease_ttl_s)))
        if res.rowcount == 1:
            return True
        if s.get(Lease, LEASE) is not None:
            return False
        s.add(Lease(name=LEASE, holder=holder, expires_at=now + timedelta(seconds=cfg.lease_ttl_s)))
        try:
            s.flush()
        except IntegrityError:
            return False
    return True


def release_lease(db: Database, holder: str) -> None:
    with db.write() as s:
        s.execute(update(Lease).where(Lease.name == LEASE, Lease.holder == holder).values(expires_at=utcnow()))


def reconcile_pass(db: Database, cfg: Config,
                   backend_for: Callable[[str], Backend] = get_backend) -> PassReport:
    holder = holder_id()
    if not acquire_lease(db, cfg, holder):
        return PassReport(ran=False)
    rep = PassReport()
    try:
        backends: dict[str, Backend] = {}

        def backend(name: str) -> Backend:
            if name not in backends:
                backends[name] = backend_for(name)
            return backends[name]

        _resolve_pending(db, cfg, backend, rep)
        _poll_live(db, cfg, backend, rep)
        for r in requeue(db, cfg, None, auto_only=True):
            if r.outcome == "requeued":
                rep.requeued.append(r.name)
    finally:
        try:
            release_lease(db, holder)
        except OrchError as e:  # e.g. still locked: the lease expires after lease_ttl_s instead
            rep.errors.append(f"lease not released: {e}")
    return rep


def _resolve_pending(db: Database, cfg: Config, backend: Callable[[str], Backend], rep: PassReport) -> None:
    """Attempts left ``pending`` by a crash around the backend call: find by token, else submit."""
    cutoff = utcnow() - timedelta(seconds=launch_grace_s())
    with db.read() as s:
        # submitted_at on a pending attempt is a launcher's claim (service.launch): leave those to it
        # until the claim is older than the grace.
        rows = s.execute(select(Attempt, Job).join(Job).where(
            Attempt.state == AttemptState.PENDING.value, Attempt.created_at < cutoff,
            (Attempt.submitted_at.is_(None)) | (Attempt.submitted_at < cutoff),
            Job.state == JobState.PENDING.value)).all()
        todo = [(a.id, j.id, j.name, j.backend, AttemptRef(None, a.token, Path(j.run_dir), a.n)) for a, j in rows]
    by_backend: dict[str, list] = {}
    for t in todo:
        by_backend.setdefault(t[3], []).append(t)
    for name, items in by_backend.items():
        rep.backend_calls += 1
        try:
            found = backend(name).find_by_token([t[4] for t in items])
        except BackendError as e:  # unknown is not "absent": resubmitting now could run it twice
            rep.errors.append(f"{name}: {e}")
            continue
        for attempt_id, job_id, job_name, _b, ref in items:
            if ref.token in found:
                record_submitted(db, job_id, attempt_id, found[ref.token])
                rep.changed.append({"name": job_name, "to": "submitted", "why": "found by token"})
            else:
                try:
                    launch(db, cfg, job_name, backend(name))
                    rep.changed.append({"name": job_name, "to": "submitted", "why": "submission was lost"})
                except OrchError as e:
                    rep.errors.append(str(e))


def _poll_live(db: Database, cfg: Config, backend: Callable[[str], Backend], rep: PassReport) -> None:
    live = (AttemptState.SUBMITTED.value, AttemptState.RUNNING.value)
    with db.read() as s:
        rows = s.execute(select(Attempt.id, Attempt.token, Attempt.external_id, Attempt.n, Job.run_dir,
                                Job.backend, Attempt.state, Attempt.restarts, Job.state.label("job_state"))
                         .join(Job).where(Attempt.state.in_(live))).all()
    by_backend: dict[str, list] = {}
    for r in rows:
        by_backend.setdefault(r.backend, []).append(r)
    for name, items in by_backend.items():
        refs = [AttemptRef(r.external_id, r.token, Path(r.run_dir), r.n) for r in items]
        try:
            outcomes = backend(name).poll(refs)
        except Exception as e:  # the scheduler could not be asked: nothing changes this pass
            rep.errors.append(f"{name} poll failed: {str(e)[:200]}")
            outcomes = {}
        rep.backend_calls += 1
        rep.polled += len(items)
        for r, ref in zip(items, refs, strict=True):
            out = outcomes.get(r.token) or Outcome(Phase.UNKNOWN, reason="backend did not answer")
            if out.phase is Phase.UNKNOWN:
                rep.unknown += 1
                continue
            if _unchanged(cfg, r, ref, out):
                continue
            try:
                _apply(db, cfg, backend(name), r.id, ref, out, rep)
            except IllegalTransition:
                pass  # another process moved this job first; its decision stands
            except DatabaseProblem:
                raise  # the DB itself (locked, corrupt): every other job would fail the same way
            except Exception as e:  # noqa: BLE001 - one job's surprise must not stall every other job
                rep.errors.append(f"{ref.run_dir.name}: {type(e).__name__}: {str(e)[:200]}")


def _unchanged(cfg: Config, r: Any, ref: AttemptRef, out: Outcome) -> bool:
    """True when ``out`` would change nothing ``_apply`` writes: skip its write transaction.

    A steady pass over 10,000 running jobs otherwise took 10,000 BEGIN IMMEDIATE transactions that
    wrote nothing (bench P1: ~0.5 ms each, and each one holds the writer lock). Decided on the
    pass's own read; if another process moved the job since, the next pass sees it.
    """
    if out.restart_count > (r.restarts or 0):
        return False
    if out.phase is Phase.RUNNING:
        return (r.state == AttemptState.RUNNING.value and r.job_state != JobState.SUBMITTED.value
                and not _hung(cfg, ref))
    if out.phase is Phase.PENDING:
        return r.job_state != JobState.RUNNING.value
    return False


def _apply(db: Database, cfg: Config, backend: Backend, attempt_id: int, ref: AttemptRef, out: Outcome,
           rep: PassReport) -> None:
    if out.phase in (Phase.PENDING, Phase.RUNNING):
        hang = out.phase is Phase.RUNNING and _hung(cfg, ref)
        with db.write() as s:
            a = s.get(Attempt, attempt_id)
            job = s.get(Job, a.job_id)
            if a.state not in (AttemptState.SUBMITTED.value, AttemptState.RUNNING.value):
                return
            a.restarts = max(a.restarts, out.restart_count)
            if out.phase is Phase.RUNNING:
                a.state = AttemptState.RUNNING.value
                a.started_at = a.started_at or utcnow()
                if job.state == JobState.SUBMITTED.value:
                    transition(s, job, JobState.RUNNING, f"attempt {a.n} running")
                    rep.changed.append({"name": job.name, "to": "running"})
            elif job.state == JobState.RUNNING.value:
                a.state = AttemptState.SUBMITTED.value
                transition(s, job, JobState.SUBMITTED, f"attempt {a.n} requeued in place by the scheduler")
                rep.changed.append({"name": job.name, "to": "submitted", "why": "requeued in place"})
            stop = None
            if hang:
                if a.failure_class != "hang":
                    a.failure_class = "hang"
                    a.detail = f"no heartbeat for {cfg.hang_timeout_s:.0f}s; stopping it"
                    a.backend_state = f"hang-stop@{time.time():.0f}"
                    stop = "term"
                elif time.time() - _stop_time(a.backend_state) >= min(HANG_KILL_GRACE_S, cfg.hang_timeout_s):
                    stop = "kill"
        if stop:
            _stop_hung(backend, ref, stop == "term", rep)
        return
    _finish(db, cfg, attempt_id, ref, out, rep)


def _stop_time(backend_state: str | None) -> float:
    try:
        return float((backend_state or "").split("@", 1)[1])
    except (IndexError, ValueError):
        return 0.0


def _hung(cfg: Config, ref: AttemptRef) -> bool:
    """No heartbeat progress for hang_timeout_s. Jobs that never write a heartbeat are not judged."""
    p = protocol.read_progress(ref.run_dir, ref.attempt)
    if not p or not isinstance(p.get("time"), (int, float)):
        return False
    try:
        # A Slurm in-place requeue restarts the wrapper (rewriting wrapper.json) long after the last
        # heartbeat of the previous run: count from the later of the two.
        started = (ref.attempt_dir / WRAPPER_FILE).stat().st_mtime
    except OSError:
        started = 0.0
    return time.time() - max(p["time"], started) > cfg.hang_timeout_s


def _stop_hung(backend: Backend, ref: AttemptRef, first: bool, rep: PassReport) -> None:
    # A hung process may never reach the point where it checks its SIGTERM flag: TERM first, then KILL.
    if first:
        backend.cancel([ref])
    else:
        kill = getattr(backend, "kill", None)
        (kill or backend.cancel)([ref])
    rep.changed.append({"name": ref.run_dir.name, "to": "stopping", "why": "hang"})


def _finish(db: Database, cfg: Config, attempt_id: int, ref: AttemptRef, out: Outcome, rep: PassReport) -> None:
    """The attempt ended: the marker decides done; otherwise classify and apply the policy."""
    verification = protocol.verify_done_marker(ref.run_dir)
    report = None if verification.verified else protocol.read_failure(ref.run_dir, ref.attempt)
    rec = read_exit(ref.attempt_dir)
    if rec is not None and rec.get("token") == ref.token and isinstance(rec.get("returncode"), int):
        # The wrapper's own record is exact; sacct reports exit 143 as 15 (it drops the 128).
        rc = rec["returncode"]
        out = replace(out, exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else out.signal)
    with db.write() as s:
        a = s.scalar(select(Attempt).where(Attempt.id == attempt_id).options(selectinload(Attempt.job)))
        job = a.job
        if a.state not in (AttemptState.SUBMITTED.value, AttemptState.RUNNING.value):
            return
        a.ended_at = utcnow()
        a.exit_code = out.exit_code if out.exit_code is not None else (-out.signal if out.signal else None)
        if out.backend_state:
            a.backend_state = out.backend_state
        a.restarts = max(a.restarts, out.restart_count)
        if verification.verified:
            a.state = AttemptState.SUCCEEDED.value
            transition(s, job, JobState.DONE, f"attempt {a.n}: marker verified")
            rep.changed.append({"name": job.name, "to": JobState.DONE.value})
            return
        preset = "hang" if a.failure_class == "hang" else None
        c = classify(out, report, verification, preset=preset)
        a.state = AttemptState.FAILED.value
        a.failure_class, a.failure_step, a.detail = c.cls, c.step, c.detail
        d = decide(cfg, job, a, c.cls, c.step, report)
        a.counted = d.counted
        action = dict(d.action)
        if d.state is JobState.RETRYABLE_FAILED:
            action["auto"] = d.auto
            action["plan"] = {"one_shot": d.one_shot, "quarantine": d.quarantine, "prune": d.prune,
                              "empty_trash": bool(d.prune) or c.cls == "enospc"}
            if d.retry_not_before:
                action["retry_not_before"] = d.retry_not_before.isoformat()
            if d.sticky:
                job.overrides_json = dumps({**job.overrides, **d.sticky})
            if d.resources:
                job.resources_json = dumps({**job.resources, **d.resources})
        a.action_json = dumps(action)
        transition(s, job, d.state, f"attempt {a.n}: {c.cls} ({c.detail[:200]}) -> {action.get('action')}")
        rep.changed.append({"name": job.name, "to": d.state.value, "class": c.cls, "action": action.get("action")})
