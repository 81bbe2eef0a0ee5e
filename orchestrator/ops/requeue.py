"""``orch requeue``: verify first, clear what is not verified, create and launch the next attempt.

For each job the marker is verified FIRST: a verified job is never cleared or resubmitted. The move
to ``pending`` is a compare-and-set, so of several concurrent requeuers (cron reconcilers, a user)
exactly one creates the next attempt; and no next attempt is created while the previous one may
still run (a cancelled attempt still checkpointing after its SIGTERM), nor while any process
still runs in its run dir (one that escaped its attempt's session with ``setsid``): the job then
stays where it is, the reason recorded as a note ``orch show`` prints, and a later pass retries.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from orchestrator import protocol
from orchestrator.backends import get_backend
from orchestrator.core import resumestate
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import expand_names, get_job
from orchestrator.core.lifecycle import (
    ATTEMPT_LIVE,
    AttemptState,
    JobState,
    create_attempt,
    move_attempt,
    move_job,
    note_held,
    open_attempt,
    utcnow,
)
from orchestrator.core.models import Attempt, Job
from orchestrator.core.passchanges import PassReport
from orchestrator.core.resources import layout_text, reshape_refusal, reshaped
from orchestrator.core.resumestate import keep_globs
from orchestrator.core.retryplan import Action
from orchestrator.core.rundir import check_run_dir
from orchestrator.core.tokens import new_token
from orchestrator.errors import DatabaseProblem, IllegalTransition, OrchError, Refused
from orchestrator.filelock import LockTimeout
from orchestrator.ops.attemptpoll import observe, polled_rows
from orchestrator.ops.launch import launch
from orchestrator.ops.liveness import host_processes
from orchestrator.ops.trash import unverified_leftovers
from orchestrator.protocol import FailureClass

A, J = AttemptState, JobState
REQUEUEABLE = frozenset({J.RETRYABLE_FAILED, J.FAILED, J.CANCELLED})


@dataclass(frozen=True)
class RequeueTarget:
    """Which jobs: the named ones (any requeueable state), every retryable_failed one, or — the
    reconciler's own pass — those whose policy requeues them by itself and whose backoff is over."""

    names: tuple[str, ...] | None = None
    auto_only: bool = False
    # A new rank layout for the next attempt (`orch requeue NAME --nodes N --nproc-per-node K`): the kit resumes on
    # any world size, and nothing else could change the shape of an existing job (a new submit of the name is
    # refused). None: as the job was.
    nodes: int | None = None
    nproc_per_node: int | None = None

    @classmethod
    def named(cls, names: list[str] | tuple[str, ...], nodes: int | None = None,
              nproc_per_node: int | None = None) -> RequeueTarget:
        return cls(names=tuple(names), nodes=nodes, nproc_per_node=nproc_per_node)

    @property
    def reshapes(self) -> bool:
        return self.nodes is not None or self.nproc_per_node is not None

    @classmethod
    def failed(cls) -> RequeueTarget:
        return cls()

    @classmethod
    def auto(cls) -> RequeueTarget:
        return cls(auto_only=True)

    @property
    def explicit(self) -> bool:
        return self.names is not None


class RequeueOutcome(enum.StrEnum):
    """What a requeue did to one job (``orch requeue`` prints it, with ``_`` as a space)."""

    REQUEUED = "requeued"  # its next attempt was created (and launched, unless the launch then failed)
    WOULD_REQUEUE = "would_requeue"  # --dry-run: what a requeue would do
    REFUSED = "refused"  # not requeued, and why (verified, live, a process still runs there, a bad run dir)
    SKIPPED = "skipped"  # another process requeued or changed it first
    ERROR = "error"  # something failed for this job only (a transient sbatch error)


R = RequeueOutcome


@dataclass
class RequeueResult:
    name: str
    outcome: RequeueOutcome
    reason: str = ""
    attempt: int | None = None
    clears: list[str] = field(default_factory=list)
    sets_aside: list[str] = field(default_factory=list)  # torn checkpoints the launch renames (dry run)
    verified: bool = False  # refused because its done marker verifies: done, nothing for a person to do

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": self.outcome, "reason": self.reason, "attempt": self.attempt,
                "clears": self.clears, "sets_aside": self.sets_aside, "verified": self.verified}


def _targets(db: Database, target: RequeueTarget) -> list[str]:
    with db.read() as s:
        if target.names is not None:
            # Unknown names fail before anything happens; a sweep's name means its tasks that ended, the
            # done ones too: their markers are verified again, as a named job's is (a damaged output of a
            # done task was never noticed by `orch requeue SWEEP`).
            return expand_names(s, list(target.names), skip=(J.PENDING, J.SUBMITTED, J.RUNNING))
        q = select(Job.name).where(Job.state == J.RETRYABLE_FAILED)
        if target.auto_only:
            # In SQL: every reconcile pass runs this, and verifying a marker hashes every artifact.
            q = q.where(Job.auto_requeue.is_(True),
                        Job.retry_not_before.is_(None) | (Job.retry_not_before <= utcnow()))
        return list(s.scalars(q.order_by(Job.id)))


def requeue(db: Database, cfg: Config, target: RequeueTarget, dry_run: bool = False) -> list[RequeueResult]:
    """Requeue the target's jobs: first every next attempt is created, then they are launched —
    sweep tasks of one sweep together (one array on Slurm), other jobs one by one."""
    results = []
    names = _targets(db, target)
    live = _LiveScan(db, names)
    for name in names:
        try:
            if (result := _requeue_one(db, cfg, name, target, dry_run, live)) is not None:
                results.append(result)
        except IllegalTransition:
            results.append(RequeueResult(name, R.SKIPPED, "another process requeued or changed it first"))
        except Refused as e:
            # One bad run dir (a symlink) is that job's refusal, not the whole pass's: raised, it
            # stopped `requeue --failed` and every reconcile pass's auto-requeue for all other jobs.
            results.append(RequeueResult(name, R.REFUSED, str(e)))
        except DatabaseProblem:
            raise  # the DB itself: every other job would fail the same way
        except OrchError as e:
            results.append(RequeueResult(name, R.ERROR, str(e)[:300]))
        except Exception as e:  # e.g. a transient sbatch failure: this job only
            results.append(RequeueResult(name, R.ERROR, f"{type(e).__name__}: {str(e)[:300]}"))
    _launch_created(db, cfg, [r for r in results if r.outcome is R.REQUEUED])
    return results


def _launch_created(db: Database, cfg: Config, created: list[RequeueResult]) -> None:
    """Launch the attempts requeue created; a launch failure becomes that job's result."""
    if not created:
        return
    from orchestrator.ops.sweep import launch_queued  # sweep builds on requeue's neighbours; imported late

    with db.read() as s:
        rows = {r.name: (r.sweep_id, r.backend) for r in s.execute(
            select(Job.name, Job.sweep_id, Job.backend).where(Job.name.in_([c.name for c in created])))}
    by_sweep: dict[int, list[RequeueResult]] = {}
    for r in created:
        sweep_id, backend_name = rows[r.name]
        if sweep_id is not None:
            by_sweep.setdefault(sweep_id, []).append(r)
            continue
        try:
            r.clears = launch(db, cfg, r.name).moved
        except Refused as e:
            r.outcome, r.reason = R.REFUSED, _own_reason(e, r.name)
        except DatabaseProblem:
            raise
        except OrchError as e:
            r.outcome, r.reason = R.ERROR, str(e)[:300]
    for sweep_id, members in by_sweep.items():
        backend_name = rows[members[0].name][1]
        try:
            done = launch_queued(db, cfg, get_backend(backend_name), sweep_id, [m.name for m in members])
        except LockTimeout as e:
            # A stopped `orch sweep` holds the launch lock: the attempts exist and a later pass launches
            # them; this must not stop the other sweeps' and jobs' requeues (it stalled them all).
            for r in members:
                r.reason = f"{r.reason}; not launched yet: {e}"
            continue
        except DatabaseProblem:
            raise
        except OrchError as e:
            for r in members:
                r.outcome, r.reason = R.ERROR, str(e)[:300]
            continue
        for r in members:
            res = done.get(r.name)
            if isinstance(res, Refused):
                r.outcome, r.reason = R.REFUSED, _own_reason(res, r.name)
            elif isinstance(res, OrchError):
                r.outcome, r.reason = R.ERROR, str(res)[:300]
            elif res is not None:
                r.clears = res.moved


def _own_reason(e: Exception, name: str) -> str:
    """A launcher's refusal ("refused: NAME: why") as this job's reason: "why". The CLI prefixes
    "refused: NAME: " itself; kept, the user read ``orch: refused: d: refused: d: ...``."""
    return str(e).removeprefix("refused: ").removeprefix(f"{name}: ")


def _settle_open_attempt(db: Database, cfg: Config, name: str) -> Attempt | None:
    """Ask the backend about the job's open attempt once (it may have ended since the last pass);
    return it if it is still open afterwards."""
    with db.read() as s:
        a = open_attempt(get_job(s, name))
    if a is None:
        return None
    if a.state in (A.SUBMITTED, A.RUNNING, A.STOPPING) and a.external_id:
        observe(db, cfg, get_backend, polled_rows(db, [a.id]), PassReport())
        with db.read() as s:
            a = open_attempt(get_job(s, name))
    return a


class _LiveScan:
    """The processes running in each run dir, scanned at most once per requeue call (a pass over
    1,000 failed jobs reads the process table once, not 1,000 times), and only if some job gets
    as far as needing it."""

    def __init__(self, db: Database, names: list[str]) -> None:
        self._db, self._names = db, names
        self._map: dict[str, list[str]] | None = None

    def in_run_dir(self, run_dir: Path) -> list[str]:
        if self._map is None:
            with self._db.read() as s:  # every target's run dir: cwd and open files are matched by path
                dirs = list(s.scalars(select(Job.run_dir).where(Job.name.in_(self._names))))
            found = host_processes([Path(d) for d in [*dirs, run_dir]])
            self._map = {os.path.realpath(d): live for d, live in found.items()}
        return self._map.get(os.path.realpath(run_dir), [])


def _hold(db: Database, name: str, reason: str) -> None:
    """Record why the job's next attempt was not launched (``lifecycle.note_held``)."""
    with db.write() as s:
        note_held(s, get_job(s, name), reason)


def _requeue_one(db: Database, cfg: Config, name: str, target: RequeueTarget, dry_run: bool,
                 live: _LiveScan) -> RequeueResult | None:
    """Requeue one job; None for a done task of a named sweep whose marker still verifies."""
    with db.read() as s:
        job = get_job(s, name)
        state, run_dir, outputs = job.state, Path(job.run_dir), list(job.outputs)
        keep = keep_globs(job.resources)
        resources, backend = dict(job.resources), job.backend
    shape = ""
    if target.reshapes:  # arguments against the job, before anything is written
        why = reshape_refusal(resources, target.nodes, target.nproc_per_node,
                              get_backend(backend).capabilities.multi_node)
        if why is not None:
            return RequeueResult(name, R.REFUSED, why)
        resources = reshaped(resources, target.nodes, target.nproc_per_node)
        shape = f"; on {layout_text(resources)}"
    if state is J.DONE and not target.explicit:
        return RequeueResult(name, R.REFUSED, "verified: done_marker_verified jobs are never rerun", verified=True)
    if state in REQUEUEABLE:
        a = _settle_open_attempt(db, cfg, name)
        if a is not None and a.state in ATTEMPT_LIVE:
            return RequeueResult(name, R.REFUSED, f"attempt {a.n} ({a.external_id or a.state.value}) is still "
                                                  f"{'stopping' if a.state is A.STOPPING else a.state.value}; "
                                                  "try again when it has exited")
    check_run_dir(cfg, run_dir)
    verification = protocol.verify_done_marker(run_dir)
    if verification.verified:
        if state is J.DONE and name not in (target.names or ()):
            return None  # a done task of a named sweep, still verified: nothing to do, nothing to say
        if state is J.DONE:
            return RequeueResult(name, R.REFUSED, "verified: done_marker_verified jobs are never rerun",
                                 verified=True)
        if not dry_run:
            _mark_verified(db, name)
        return RequeueResult(name, R.REFUSED, "verified: its done marker verifies; never cleared or rerun",
                             verified=True)
    if state is J.DONE and not dry_run:
        _unverify(db, name, verification)  # named, and its marker no longer verifies
    with db.read() as s:
        job = get_job(s, name)
        state = job.state
        last = job.attempts[-1] if job.attempts else None
        plan = last.action if last else None
    if state is J.DONE and dry_run:
        state = J.RETRYABLE_FAILED  # what the real requeue would move it to first
    if not target.explicit and state is not J.RETRYABLE_FAILED:
        # Listed as retryable_failed a moment ago: another requeuer or reconciler moved it first (not a refusal:
        # `requeue --failed` exits 3 on one, and two at once refused each other's jobs).
        return RequeueResult(name, R.SKIPPED, "another process requeued or changed it first")
    if state not in REQUEUEABLE:
        return RequeueResult(name, R.REFUSED, f"job is {state.value}; only failed, retryable_failed or "
                                              "cancelled jobs can be requeued (cancel a live one first)")
    action = plan.action if plan and plan.action.retries else Action.RESUME
    if procs := live.in_run_dir(run_dir):
        # Never two live attempts: a process of an earlier attempt (escaped from its session) still
        # runs there and would share the run dir with the next one.
        reason = (f"live process(es) still run in {run_dir}: {', '.join(procs[:5])}"
                  + (f" and {len(procs) - 5} more" if len(procs) > 5 else "") + "; stop them first")
        if not dry_run:
            _hold(db, name, reason)
        return RequeueResult(name, R.REFUSED, reason)
    if dry_run:
        clears = unverified_leftovers(run_dir, outputs, plan.quarantine if plan else (), keep)
        clears += [p for p in (plan.prune if plan else ()) if p not in clears]
        torn = [f"{rel} ({why})" for rel, why in resumestate.torn(run_dir, keep)]
        return RequeueResult(name, R.WOULD_REQUEUE, f"{action}{shape}", (last.n + 1) if last else 1, clears, torn)
    with db.write() as s:
        job = get_job(s, name)
        if job.state is not state:
            raise IllegalTransition("changed")
        if shape:
            shape += f", was {layout_text(job.resources)}"
            job.resources = resources
        move_job(s, job, J.PENDING, f"requeue ({action}){shape}")
        n = (max(a.n for a in job.attempts) + 1) if job.attempts else 1
        create_attempt(s, job, n, new_token(), plan=plan if plan and plan.action.retries else None)
    return RequeueResult(name, R.REQUEUED, f"{action}{shape}", n)  # launched by _launch_created


def _unverify(db: Database, name: str, v: protocol.Verification) -> None:
    """A done job named to ``orch requeue`` whose marker no longer verifies (its result was corrupted
    or deleted after verification): done no longer holds, so it leaves done_marker_verified, with
    the class on the attempt that had verified it; the requeue then goes on as for any failed job
    (the broken marker and result go to trash). Only a named requeue gets here: ``--failed`` and
    the reconciler never look at done jobs (verifying every marker would hash every result)."""
    cls = FailureClass.MARKER_MISSING if v.status is protocol.MarkerStatus.ABSENT else FailureClass.MARKER_CORRUPT
    with db.write() as s:
        job = get_job(s, name)
        if job.state is not J.DONE:
            raise IllegalTransition("changed")
        # The class is the job's event, not its last attempt's: that attempt did succeed (its result broke
        # later), and stamped marker_corrupt it read as a failed attempt in orch show.
        move_job(s, job, J.RETRYABLE_FAILED, f"{cls.value}: its marker no longer verifies ({v})"[:2000])


def _mark_verified(db: Database, name: str) -> None:
    """The marker verifies: the job is done, and any attempt it still has open and unlaunched closes."""
    with db.write() as s:
        job = get_job(s, name)
        a = open_attempt(job)
        if a is not None and a.state in (A.PENDING, A.LAUNCHING):
            move_attempt(s, a, A.CANCELLED, detail="not launched: the run dir's marker verifies")
        if job.state is not J.DONE:
            move_job(s, job, J.DONE, "marker verified at requeue")
