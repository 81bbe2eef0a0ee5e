"""Launching an attempt: claim it, prepare its run dir, hand it to the backend, record the id.

Exactly-once: the attempt row (state ``pending``, a unique token) is committed BEFORE any backend
call, and a launcher first claims it by compare-and-set (``pending -> launching``), so of two
launchers (a user's requeue and a cron pass) exactly one calls the backend. The token travels with
the job; a launcher that died inside the backend call leaves a ``launching`` attempt whose claim
expires, and the reconciler then asks the backend for the token before it launches again
(``reconcile``): it submits only if the backend answered that it has no trace.

Fencing, not timers (a launcher slowed by hashing a big checkpoint, or stopped with Ctrl-Z, outlived
the grace and then submitted a second live copy beside the re-claimer's). Every claim and re-claim
increments ``attempts.fence`` in the same compare-and-set UPDATE; the winner writes the generation to
``attempts/<n>/fence.json`` and calls the backend only after re-checking, in the DB, that the attempt
is still ``launching`` under its generation (else outcome ``lost_claim``). The job wrapper gets its
generation (``--fence``) and runs the program only if the fence file still names it. A re-claimer
looks the token up AGAIN after writing its fence: a submission the old launcher made meanwhile, whose
wrapper may have read the old fence, is adopted (its id recorded, the fence file restored to its
generation) instead of being joined by a second one. Residual: a wrapper of that adopted submission
that read the NEW fence in that instant exits without running the program; the attempt then ends
without an exit record and is retried — never two copies. A healthy launcher renews its claim while
it prepares (``claimkeeper.ClaimKeeper``), so only a stopped or dead one loses it: the grace is a recovery delay.
The claim and its re-check are ``launchclaim``'s; recording the id, or why the attempt ended, ``launchrecord``'s.

Every way a launch can fail ends the attempt with a reason, so no job is left ``pending`` for ever
: a refusal (a symlinked ``attempts/``, a scheduler that will never take the submission)
fails it ``invalid``; a filesystem error (ENOSPC, a file where a directory must be) fails it as a
retryable class; only a transient scheduler error keeps the claim, for the reconciler to retry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from orchestrator import protocol, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, Backend, BackendError, SubmitSpec
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.core.models import Attempt, Job
from orchestrator.core.resumestate import keep_globs
from orchestrator.decide.mtbf import mtbf_env
from orchestrator.decide.policy import command_for
from orchestrator.decide.suspects import exclusion_for, with_exclusion
from orchestrator.errors import OrchError, Refused
from orchestrator.ops.claimkeeper import ClaimKeeper
from orchestrator.ops.launchclaim import (
    Launched,
    LaunchOutcome,
    LostClaim,
    check_claim,
    check_claims,
    claim,
    claim_all,
    claim_keeper,
)
from orchestrator.ops.launchprep import check_and_prepare, dumps, make_spec, new_batch_token, sweep_env
from orchestrator.ops.launchrecord import (
    close_verified,
    group_write_failed,
    mark_batch,
    prepare_failed,
    record_group,
    record_own,
    record_submitted,
    submission_failed,
)

# What a launch returns lives in launchclaim (its re-check returns it too); callers name it from here.
__all__ = ["LaunchOutcome", "Launched", "launch", "launch_group"]

A, J = AttemptState, JobState


@dataclass
class _Read:
    """A launchable attempt as the DB held it before the claim: what preparing and submitting it need."""

    name: str
    job_id: int
    attempt_id: int
    env_id: int | None
    spec: SubmitSpec
    overrides: dict[str, Any]
    plan: Any
    outputs: list[str]
    keep: list[str]
    backend_name: str
    reclaimed: bool  # a re-claim of an expired launch: look the token up again before submitting
    lookup_key: str  # what that look-up asks for (the old group's token for a sweep task)


@dataclass
class _Ready:
    """An attempt claimed by this launcher, its run dir prepared: what it was read as, plus what the claim and
    the preparation added (the spec under this launcher's fence, what the launch moved aside)."""

    read: _Read
    spec: SubmitSpec
    moved: list[str]
    fence: int  # this launcher's claim generation

    name = property(lambda self: self.read.name)
    job_id = property(lambda self: self.read.job_id)
    attempt_id = property(lambda self: self.read.attempt_id)
    env_id = property(lambda self: self.read.env_id)
    overrides = property(lambda self: self.read.overrides)
    reclaimed = property(lambda self: self.read.reclaimed)
    lookup_key = property(lambda self: self.read.lookup_key)


def _read_attempt(s: Any, cfg: Config, job: Job, backend_name: str | None) -> _Read | None:
    """The job's pending (or launching) attempt, read in session ``s``; None when it has none."""
    a = job.attempts[-1] if job.attempts else None
    if a is None or a.state not in (A.PENDING, A.LAUNCHING):
        return None
    argv, overrides = command_for(job, a.plan)
    env = {protocol.ENV_OVERRIDES: dumps(overrides)}
    env.update(mtbf_env(s, job.backend, job.resources))  # ORCH_MTBF_S: --save-interval auto's M (mtbf.py)
    if job.sweep is not None and job.task_index is not None:
        env.update(sweep_env(job.sweep.name, job.task_index, job.sweep.params))
    spec = make_spec(cfg, job=job.name, attempt=a.n, token=a.token, run_dir=job.run_dir, argv=argv,
                     outputs=list(job.outputs), env=env, resources=job.resources, task=job.task_index,
                     base_env=job.environment.vars if job.environment else None)
    return _Read(job.name, job.id, a.id, job.env_id, spec, overrides, a.plan, list(job.outputs),
                 keep_globs(job.resources), backend_name or job.backend, a.state is A.LAUNCHING,
                 a.batch_token or a.token)


def _ready(db: Database, cfg: Config, name: str, backend_name: str | None, reclaim: bool,
           keeper: ClaimKeeper) -> _Ready | Launched:
    """Read, claim, check and prepare the job's pending attempt (``reclaim``: its expired launching one).

    Returns a Launched when there is nothing to submit (another launcher has it; the marker verifies).
    Raises Refused / OrchError after ending the attempt with the reason.
    """
    with db.read() as s:
        rd = _read_attempt(s, cfg, get_job(s, name), backend_name)
    if rd is None:
        return Launched(outcome=LaunchOutcome.LOST_CLAIM)
    fence = claim(db, rd.attempt_id, reclaim)
    if fence is None:
        return Launched(outcome=LaunchOutcome.LOST_CLAIM)  # another process is launching this attempt right now
    return _claimed(db, cfg, rd, fence, keeper)


def _claimed(db: Database, cfg: Config, rd: _Read, fence: int, keeper: ClaimKeeper,
             batch: protocol.SyncBatch | None = None) -> _Ready | Launched:
    """Check and prepare an attempt this launcher claimed under ``fence``. ``batch``: its records are
    written there (in place once the caller commits it), not each made durable on its own."""
    keeper.add(rd.attempt_id, fence)
    spec = dataclasses.replace(rd.spec, fence=fence)
    try:
        moved = check_and_prepare(cfg, spec, rd.plan, rd.outputs, rd.backend_name, rd.keep, batch)
    except (Refused, protocol.UnsafePath, OSError) as e:
        prepare_failed(db, cfg, rd.name, rd.attempt_id, e)
    if moved is None:  # the marker verifies
        close_verified(db, rd.attempt_id, rd.job_id)
        return Launched(outcome=LaunchOutcome.VERIFIED)
    return _Ready(rd, spec, moved, fence)


def launch(db: Database, cfg: Config, name: str, backend: Backend | None = None, *,
           reclaim: bool = False) -> Launched:
    """Launch the job's pending attempt (``reclaim``: or its expired launching one).

    Raises Refused when the attempt was refused for good (the attempt and job are failed first),
    OrchError for a launch that failed (the attempt is ended with its class, or, for a transient
    scheduler error, left to the reconciler).
    """
    with claim_keeper(db) as keeper:
        r = _ready(db, cfg, name, backend.name if backend else None, reclaim, keeper)
        if isinstance(r, Launched):
            return r
        if backend is None:
            with db.read() as s:
                backend = get_backend(s.get(Job, r.job_id).backend)
        testhooks.site("before_backend_submit")
        adopted = _adopt_if_submitted(db, backend, r) if r.reclaimed else None
        if adopted is not None:
            return adopted
    lost = check_claim(db, r.attempt_id, r.fence)
    if lost is not None:
        return Launched(moved=r.moved, outcome=lost)
    testhooks.site("fence_checked")
    try:
        external_id = backend.submit(with_exclusion(db, cfg, backend, r.spec))

    except (BackendError, OSError) as e:
        submission_failed(db, cfg, [r], e)
    testhooks.site("after_backend_submit")
    return record_own(db, backend, r, external_id)


def launch_group(db: Database, cfg: Config, names: list[str], backend: Backend, throttle: int | None, *,
                 reclaim: bool = False) -> dict[str, Launched | OrchError]:
    """Launch the pending attempts of several sweep tasks as ONE group submission per set of equal
    resources (a Slurm array: one sbatch, not one per task). Per name: what happened, or the error.

    Each attempt is claimed (its own compare-and-set) and prepared on its own (a task whose run dir is
    refused fails alone); the group's token is recorded on every member before the backend call, so a
    crash inside it is resolved by the reconciler for the whole array at once (``find_by_token`` of the
    batch token). The steps are batched, not the decisions: one read, one transaction each for
    the claims, the fence re-checks, the batch token and the submitted ids, and one flush of every task's
    files before the backend call (``SyncBatch``), where a 1,000-task sweep took 5 transactions and 6
    fsyncs per task. A crash between any two steps leaves each attempt where the per-task code could have.
    """
    results: dict[str, Launched | OrchError] = {}
    ready: list[_Ready] = []
    with claim_keeper(db) as keeper:  # every member's claim is renewed until all are prepared
        reads = _read_group(db, cfg, names, backend.name, results)
        fences = claim_all(db, [rd.attempt_id for rd in reads], reclaim)
        testhooks.site("group_claimed")
        batch = protocol.SyncBatch()
        batch_tokens: dict[tuple, str] = {}  # one per group below, chosen now: each fence record names its own
        for rd in reads:
            if rd.attempt_id not in fences:
                results[rd.name] = Launched(outcome=LaunchOutcome.LOST_CLAIM)  # another launcher has it
                continue
            key = (rd.spec.resources, rd.spec.warning_signal, rd.env_id)
            if key not in batch_tokens:
                batch_tokens[key] = new_batch_token()
            rd.spec = dataclasses.replace(rd.spec, batch=batch_tokens[key])
            try:
                r = _claimed(db, cfg, rd, fences[rd.attempt_id], keeper, batch)
            except OrchError as e:
                results[rd.name] = e
                continue
            if isinstance(r, Launched):
                results[rd.name] = r
            else:
                ready.append(r)
        testhooks.site("group_written")
        ready = _commit_group(db, cfg, batch, ready, results)
        testhooks.site("before_backend_submit")
        for r in list(ready):
            try:
                adopted = _adopt_if_submitted(db, backend, r) if r.reclaimed else None
            except OrchError as e:
                results[r.name], adopted = e, None
                ready.remove(r)
            if adopted is not None:
                results[r.name] = adopted
                ready.remove(r)
    groups: dict[str | None, list[_Ready]] = {}  # by the batch each member's fence record names
    lost = check_claims(db, [(r.attempt_id, r.fence) for r in ready])
    for r in ready:
        if lost[r.attempt_id] is not None:
            results[r.name] = Launched(moved=r.moved, outcome=lost[r.attempt_id])
        else:
            groups.setdefault(r.spec.batch, []).append(r)  # one batch per (resources, signal, env), above
    testhooks.site("fence_checked")
    for batch_token, members in groups.items():
        marked = mark_batch(db, [r.attempt_id for r in members], batch_token)
        members = [r for r in members if r.attempt_id in marked]
        try:
            exclude = exclusion_for(db, cfg, backend, members[0].spec.resources) if members else ()
            ids = backend.submit_group([dataclasses.replace(r.spec, exclude_nodes=exclude) for r in members],
                                       batch_token, throttle)
        except (BackendError, OSError) as e:
            try:
                submission_failed(db, cfg, members, e)
            except OrchError as err:
                for r in members:
                    results[r.name] = err
            continue
        testhooks.site("after_backend_submit")
        results.update(record_group(db, backend, members, ids))
    return results


def _read_group(db: Database, cfg: Config, names: list[str], backend_name: str,
                results: dict[str, Launched | OrchError]) -> list[_Read]:
    """``_read_attempt`` of each named job, in one read transaction (jobs and attempts loaded by one
    query each, not one per task); a name with nothing to launch gets its outcome in ``results``."""
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    out: list[_Read] = []
    with db.read() as s:
        jobs = {j.name: j for j in s.scalars(select(Job).where(Job.name.in_(names))
                                             .options(selectinload(Job.attempts)))}
        for name in names:
            rd = _read_attempt(s, cfg, jobs[name], backend_name) if name in jobs else None
            if rd is None:
                results[name] = Launched(outcome=LaunchOutcome.LOST_CLAIM)
            else:
                out.append(rd)
    return out


def _commit_group(db: Database, cfg: Config, batch: protocol.SyncBatch, ready: list[_Ready],
                  results: dict[str, Launched | OrchError]) -> list[_Ready]:
    """Put every prepared task's records in place with one flush; if that fails, nothing is in place and
    each of those attempts fails as a failed write would have failed it alone (nothing was submitted)."""
    try:
        batch.commit()
    except OSError as e:
        group_write_failed(db, cfg, ready, results, e)
        return []
    return ready


def _adopt_if_submitted(db: Database, backend: Backend, r: _Ready) -> Launched | None:
    """A re-claim, after its new fence is on disk: look the token up AGAIN. The old launcher may have
    submitted after the reconciler's first look-up found nothing, and its wrapper may have read the
    old fence before the new one was written: that submission is adopted (its id recorded, the fence
    file restored to its generation) instead of a second one being started beside it."""
    key = r.lookup_key or r.spec.token
    try:
        found = backend.find_by_token([AttemptRef(None, key, r.spec.run_dir, r.spec.attempt)])
    except BackendError as e:  # unknown is not "absent": the claim lapses and a later pass asks again
        raise OrchError(f"{r.name}: cannot look its launch up again before submitting: {e}") from None
    ext = found.get(key)
    if ext is None:
        return None
    if key != r.spec.token and r.spec.task is not None:
        ext = f"{ext}_{r.spec.task}"  # the old array's id + this task's index
    with db.read() as s:
        old = s.get(Attempt, r.attempt_id).launched_fence
    try:
        stopped = record_submitted(db, r.attempt_id, ext, backend=backend, fence=r.fence)
    except LostClaim:
        return Launched(ext, r.moved, LaunchOutcome.LOST_CLAIM)
    if old is not None:
        # Its wrapper runs (again, on a requeue); an old array task's record names its batch again.
        group = protocol.GroupSlot(key, r.spec.task) if key != r.spec.token and r.spec.task is not None else None
        protocol.write_fence(r.spec.attempt_dir, r.spec.token, old, group=group)
    return Launched(ext, r.moved, LaunchOutcome.STOPPED if stopped else LaunchOutcome.ADOPTED)
