"""One reconciler pass (cron runs ``orch reconcile`` every minute; ``--watch`` loops).

A pass: take the lease (a second overlapping pass exits quietly), settle launches a crash left in
doubt (by token), poll every open attempt with ONE backend call per backend and apply what it says
(``observe``), and requeue what the policy requeues by itself. Releasing the lease also stores the
pass's duration and failed scheduler queries (``pass_stats``); with ``[metrics] textfile_dir`` set,
the pass then rewrites node_exporter's ``orch.prom`` (``orchestrator.views.metrics``).

A pass reads only open attempts (an index on attempts.state), so its cost does not grow with
history. Every state a job can enter has a way out that a pass takes by itself: a ``pending``
attempt nobody launched is launched; a ``launching`` one whose launcher died is found by token or
launched again; a ``stopping`` one is killed after its grace and ended when gone.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from orchestrator import filelock, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, Backend, BackendError
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.lifecycle import AttemptState, JobState, move_attempt, set_attempt_fields, utcnow
from orchestrator.core.models import Attempt, Job, Lease, Sweep
from orchestrator.core.passchanges import Change, PassReport
from orchestrator.errors import DatabaseProblem, IllegalTransition, OrchError
from orchestrator.filelock import LockTimeout, lock_timeout_s
from orchestrator.ops.attemptpoll import observe, polled_rows
from orchestrator.ops.claimkeeper import launch_grace_s
from orchestrator.ops.launch import LaunchOutcome, launch, launch_group
from orchestrator.ops.launchrecord import record_submitted
from orchestrator.ops.requeue import RequeueOutcome, RequeueTarget, requeue
from orchestrator.ops.sweep import launch_queued
from orchestrator.ops.tallies import settle_tallies
from orchestrator.views.metrics import export_after_pass, record_pass

__all__ = ["PassReport", "reconcile_pass", "acquire_lease", "release_lease"]

A, J = AttemptState, JobState
LEASE = "reconcile"
# A pass waits at most this long for a sweep's launch lock (a pass never spends more than a few seconds on
# locks, whatever their holders do); the holder launches those tasks, or the next pass does.
PASS_LOCK_WAIT_S = 2.0


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
        try:
            # A savepoint: on PostgreSQL a failed INSERT aborts the whole transaction otherwise.
            with s.begin_nested():
                s.add(Lease(name=LEASE, holder=holder, expires_at=now + timedelta(seconds=cfg.lease_ttl_s)))
        except IntegrityError:
            return False
    return True


def take_over_from_a_stopped_holder(db: Database, cfg: Config, holder: str) -> str:
    """Take the lease at once from a reconciler on this host that is stopped (Ctrl-Z, kill -STOP), and say so;
    else '' (the lease stays as it is).

    A hostile pass found it: a stopped ``orch reconcile`` held the lease for its whole ``lease_ttl_s``, and every
    pass meanwhile did nothing, quietly: a finished job's ``submit --wait`` took 120 s. Taking it is as safe as
    its expiry (a holder that resumes after either works on beside the next pass, as one that outlives its lease
    does): every change a pass makes is a compare-and-set. Only positive evidence counts: a holder on another
    host, or a process of another PID namespace, is waited for until its lease expires."""
    with db.write() as s:
        row = s.get(Lease, LEASE)
        if row is None or row.holder == holder:
            return ""
        host, _, pid = row.holder.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit() or not filelock.is_stopped(int(pid)):
            return ""
        who = filelock.process_name(int(pid))
        if "orch" not in who:
            return ""  # the pid now names another process
        if s.execute(update(Lease).where(Lease.name == LEASE, Lease.holder == row.holder)
                     .values(holder=holder, expires_at=utcnow() + timedelta(seconds=cfg.lease_ttl_s))).rowcount != 1:
            return ""
    return (f"took over the reconcile lease from pid {pid} ({who}, stopped): resume it with kill -CONT {pid}, or "
            "end it")


def lease_holder(db: Database) -> str:
    """Who holds the lease, and until when, for the message of a pass that did nothing."""
    with db.read() as s:
        row = s.get(Lease, LEASE)
    if row is None:
        return ""
    host, _, pid = row.holder.rpartition(":")
    return f"pid {pid} on {host} until {row.expires_at.isoformat(timespec='seconds')}Z"


def release_lease(db: Database, holder: str, rep: PassReport | None = None) -> None:
    """Free the lease; with ``rep``, store the pass's stats for ``orch metrics`` in the same transaction."""
    with db.write() as s:
        s.execute(update(Lease).where(Lease.name == LEASE, Lease.holder == holder).values(expires_at=utcnow()))
        if rep is not None:
            record_pass(s, rep)


def reconcile_pass(db: Database, cfg: Config,
                   backend_for: Callable[[str], Backend] = get_backend) -> PassReport:
    db.check_identity()
    holder = holder_id()
    took_over = ""
    if not acquire_lease(db, cfg, holder):
        took_over = take_over_from_a_stopped_holder(db, cfg, holder)
        if not took_over:
            return PassReport(ran=False, lease_holder=lease_holder(db))
    t0 = time.monotonic()
    rep = PassReport(warnings=[took_over] if took_over else [])
    backends: dict[str, Backend] = {}

    def backend(name: str) -> Backend:
        if name not in backends:
            backends[name] = backend_for(name)
        return backends[name]

    try:
        _settle_launches(db, cfg, backend, rep)
        observe(db, cfg, backend, polled_rows(db), rep)
        _launch_queued_tasks(db, cfg, backend, rep)  # after observe: slots this pass freed are used now
        for r in requeue(db, cfg, RequeueTarget.auto()):
            if r.outcome is RequeueOutcome.REQUEUED:
                rep.requeued.append(r.name)
            elif r.outcome is RequeueOutcome.ERROR:
                rep.errors.append(f"{r.name}: {r.reason}")
        try:
            settle_tallies(db)  # `orch metrics` then sums these instead of reading the history's run dirs
        except OrchError as e:  # e.g. the DB locked past the busy timeout: the next pass settles them
            rep.errors.append(f"metrics tallies not settled: {e}")
        except Exception as e:  # a tally only counts: a surprise in one must never stop a pass (recovery)
            rep.errors.append(f"metrics tallies not settled: {type(e).__name__}: {e}")
    finally:
        rep.query_failures += sum(getattr(b, "query_failures", 0) for b in backends.values())
        rep.duration_s = time.monotonic() - t0
        try:
            release_lease(db, holder, rep)
        except OrchError as e:  # e.g. still locked: the lease expires after lease_ttl_s instead
            rep.errors.append(f"lease not released: {e}")
    export_after_pass(db, cfg, rep)
    return rep


def _settle_launches(db: Database, cfg: Config, backend: Callable[[str], Backend], rep: PassReport) -> None:
    """Attempts a crash (or a transient scheduler error) left before or inside a backend call, and
    sweep tasks waiting for a slot.

    - ``pending`` for longer than the grace: the submitter died before claiming it; it never reached
      the backend, so launch it. A local sweep's pending tasks are its queue: launched as soon as the
      throttle leaves room.
    - ``launching`` (or ``stopping`` without an id: a cancel overtook the launch) whose claim expired:
      the launcher died or gave up inside the backend call. Ask the backend for the token (an array's
      batch token for a sweep task); launch again only when it answered that it has no trace (unknown
      is not "absent": a resubmission then could run the job twice).
    """
    cutoff = utcnow() - timedelta(seconds=launch_grace_s())
    with db.read() as s:
        fresh = s.execute(select(Job.name, Job.backend).join(Attempt).where(
            Attempt.state == A.PENDING, Attempt.created_at < cutoff, Job.sweep_id.is_(None))).all()
        doubt = s.execute(select(Attempt.id, Attempt.state, Attempt.token, Attempt.n, Attempt.batch_token,
                                 Job.name, Job.backend, Job.run_dir, Job.task_index, Job.sweep_id).join(Job).where(
            Attempt.state.in_((A.LAUNCHING, A.STOPPING)), Attempt.external_id.is_(None),
            Attempt.claimed_at.is_not(None), Attempt.claimed_at < cutoff)).all()
    for name, backend_name in fresh:
        _launch(db, cfg, name, backend(backend_name), rep, reclaim=False)
    by_backend: dict[str, list] = {}
    for row in doubt:
        by_backend.setdefault(row.backend, []).append(row)
    for backend_name, rows in by_backend.items():
        rep.backend_calls += 1
        b = backend(backend_name)
        # A group's attempts are looked up once, by the group's token (the array's name).
        lookup = {r.batch_token or r.token: r for r in rows}
        try:
            found = b.find_by_token([AttemptRef(None, key, Path(r.run_dir), r.n) for key, r in lookup.items()])
        except BackendError as e:
            rep.errors.append(f"{backend_name}: {e}")
            rep.query_failures += 1
            continue
        testhooks.site("tokens_looked_up")
        relaunch: dict[int | None, list[str]] = {}
        for r in rows:
            ext = found.get(r.batch_token or r.token)
            if ext is not None and r.batch_token:
                ext = f"{ext}_{r.task_index}"  # the array's id + this task's index
            if r.state is A.STOPPING:
                _stop_overtaken(db, b, r, ext, rep)
            elif ext is not None:
                record_submitted(db, r.id, ext, backend=b)
                rep.changed.append(Change(r.name, J.SUBMITTED, "found by token"))
            elif r.batch_token:
                relaunch.setdefault(r.sweep_id, []).append(r.name)
            else:
                _launch(db, cfg, r.name, b, rep, reclaim=True)
        for names in relaunch.values():
            with db.read() as s:
                throttle = s.scalar(select(Sweep.throttle).join(Job).where(Job.name == names[0]))
            _note_launches(launch_group(db, cfg, names, b, throttle, reclaim=True), rep)


def _launch_queued_tasks(db: Database, cfg: Config, backend: Callable[[str], Backend], rep: PassReport) -> None:
    """Sweep tasks whose attempt waits: the queue orch keeps for a backend without a group queue (as the
    throttle leaves room), and, where the scheduler keeps it (a Slurm array), pending tasks older than the
    launch grace (their launcher died before the array)."""
    cutoff = utcnow() - timedelta(seconds=launch_grace_s())
    waiting: dict[tuple[int, str], bool] = {}  # (sweep, backend) -> some pending task is past the grace
    q = (select(Sweep.id, Sweep.backend, Attempt.created_at < cutoff).select_from(Sweep).join(Job).join(Attempt)
         .where(Attempt.state == A.PENDING).distinct())
    with db.read() as s:
        for sweep_id, backend_name, old in s.execute(q):
            waiting[sweep_id, backend_name] = waiting.get((sweep_id, backend_name), False) or bool(old)
    lock_held = False
    for (sweep_id, backend_name), old in waiting.items():
        b = backend(backend_name)
        orch_queue = not b.capabilities.group_queue
        if not orch_queue and not old:
            continue  # its launcher is still within the grace: the array is on its way
        if lock_held and orch_queue:
            continue  # the launch lock's holder was named once; its sweeps wait for the next pass
        try:
            wait = min(PASS_LOCK_WAIT_S, lock_timeout_s())
            _note_launches(launch_queued(db, cfg, b, sweep_id, lock_wait_s=wait), rep)
        except DatabaseProblem:
            raise
        except LockTimeout as e:  # a stopped `orch sweep` holds it: skip what it blocks, go on with the rest
            lock_held = True
            rep.errors.append(f"local sweep tasks not launched this pass: {e}")
        except OrchError as e:  # one sweep's trouble (its launch lock unusable) must not stop the pass
            rep.errors.append(str(e))


def _note_launches(results: dict, rep: PassReport) -> None:
    for name, res in results.items():
        if isinstance(res, OrchError):
            rep.errors.append(str(res))
        elif res.outcome is LaunchOutcome.SUBMITTED:
            rep.changed.append(Change(name, J.SUBMITTED, "launched"))
        elif res.outcome is LaunchOutcome.ADOPTED:
            rep.changed.append(Change(name, J.SUBMITTED, "found by token after its re-claim"))


def _launch(db: Database, cfg: Config, name: str, b: Backend, rep: PassReport, *, reclaim: bool) -> None:
    try:
        done = launch(db, cfg, name, b, reclaim=reclaim)
        if done.outcome is LaunchOutcome.SUBMITTED:
            rep.changed.append(Change(name, J.SUBMITTED, "submission was lost"))
        elif done.outcome is LaunchOutcome.ADOPTED:  # the old launcher submitted after all, while this pass re-claimed
            rep.changed.append(Change(name, J.SUBMITTED, "found by token after its re-claim"))
    except DatabaseProblem:
        raise
    except OrchError as e:
        rep.errors.append(str(e))


def _stop_overtaken(db: Database, b: Backend, r: object, ext: str | None, rep: PassReport) -> None:
    """A cancel overtook a launch whose launcher then died: stop what it submitted, or close it."""
    with db.write() as s:
        a = s.get(Attempt, r.id)
        if a.state is not A.STOPPING or a.external_id is not None:
            return
        if ext is None:
            try:
                move_attempt(s, a, A.CANCELLED, failure_class="cancelled",
                             detail="cancelled during its launch; the backend never had it")
            except IllegalTransition:
                return
            rep.changed.append(Change(r.name, A.CANCELLED, "launch never reached the backend"))
            return
        set_attempt_fields(s, a, A.STOPPING, external_id=ext)
    b.cancel([AttemptRef(ext, r.token, Path(r.run_dir), r.n, batch=r.batch_token, task=r.task_index)])
    rep.changed.append(Change(r.name, A.STOPPING, "cancelled during its launch"))
