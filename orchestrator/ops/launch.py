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

Every way a launch can fail ends the attempt with a reason, so no job is left ``pending`` for ever
: a refusal (a symlinked ``attempts/``, a scheduler that will never take the submission)
fails it ``invalid``; a filesystem error (ENOSPC, a file where a directory must be) fails it as a
retryable class; only a transient scheduler error keeps the claim, for the reconciler to retry.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy import update

from orchestrator import protocol, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, Backend, BackendError, SubmitSpec
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import attempt_ref, get_job
from orchestrator.core.lifecycle import (
    AttemptState,
    JobState,
    Move,
    claim_expired,
    move_attempt,
    move_job,
    move_many,
    set_attempt_fields,
    utcnow,
)
from orchestrator.core.models import Attempt, Job
from orchestrator.core.resumestate import keep_globs
from orchestrator.decide.mtbf import mtbf_env
from orchestrator.decide.policy import command_for
from orchestrator.decide.suspects import exclusion_for, with_exclusion
from orchestrator.errors import IllegalTransition, OrchError, Refused
from orchestrator.jobside.ballast import give_back
from orchestrator.ops.claimkeeper import ClaimKeeper, launch_grace_s
from orchestrator.ops.launchprep import Held, check_and_prepare, dumps, make_spec, new_batch_token, sweep_env
from orchestrator.protocol import FailureClass

__all__ = ["launch_grace_s", "new_batch_token", "sweep_env"]  # re-exported (their home: claimkeeper, launchprep)

A, J = AttemptState, JobState


class LaunchOutcome(enum.StrEnum):
    """What a launch call came to."""

    SUBMITTED = "submitted"  # this launcher's backend call was accepted
    ADOPTED = "adopted"  # a re-claimer found the earlier launcher's submission by its token, and kept it
    LOST_CLAIM = "lost_claim"  # another launcher holds the attempt (or took it over): nothing submitted here
    VERIFIED = "verified"  # the marker verified before the backend call: closed unlaunched, the job done
    STOPPED = "stopped"  # orch cancel came first: closed (or stopped) unlaunched


@dataclass
class Launched:
    """What a launch did: the backend id (None when it did not reach the backend), what it trashed."""

    external_id: str | None = None
    moved: list[str] = field(default_factory=list)
    outcome: LaunchOutcome = LaunchOutcome.SUBMITTED
    detail: str = ""


def _claim(db: Database, attempt_id: int, reclaim: bool) -> int | None:
    """pending -> launching (or, ``reclaim``, an expired launching claim -> a new one); the claim's
    fencing generation, taken in the same compare-and-set UPDATE, or None when another has it."""
    return _claim_all(db, [attempt_id], reclaim).get(attempt_id)


def _preload(s: Any, attempt_ids: list[int], jobs: bool = False) -> dict[int, Any]:
    """These attempts (and, ``jobs``, their jobs, under ``("job", id)``) read into session ``s`` by a few
    queries, not one SELECT each. Keep the dict while using them: the session's identity map
    holds rows weakly, and a dropped row is read again by ``s.get``."""
    from sqlalchemy import select

    rows: dict[Any, Any] = {}
    for i in range(0, len(attempt_ids), 500):  # below every SQLite's bound-parameter limit
        # FOR UPDATE: the rows stay as read until commit (PostgreSQL; SQLite's write lock does it already),
        # so move_many's decisions, taken on these reads, hold.
        chunk = list(s.scalars(select(Attempt).where(Attempt.id.in_(attempt_ids[i:i + 500])).with_for_update()))
        rows.update((a.id, a) for a in chunk)
        if jobs:
            for j in s.scalars(select(Job).where(Job.id.in_({a.job_id for a in chunk})).with_for_update()):
                rows["job", j.id] = j
    return rows


def _claim_all(db: Database, attempt_ids: list[int], reclaim: bool) -> dict[int, int]:
    """``_claim`` of many attempts in ONE write transaction (each its own compare-and-set): attempt id ->
    its new fence, for those this launcher now holds. A transaction per task was most of a sweep."""
    if not attempt_ids:
        return {}
    try:
        with db.write() as s, s.no_autoflush:
            rows = _preload(s, attempt_ids)
            now, moves, fences = utcnow(), [], {}
            for attempt_id in attempt_ids:
                move = _claim_move(rows[attempt_id], reclaim, now)
                if move is not None:
                    moves.append(move)
                    fences[attempt_id] = move.values["fence"]
            move_many(s, moves)
            return fences
    except IllegalTransition:  # a row changed under the batch (rolled back whole): one by one instead
        pass
    fences = {}
    for attempt_id in attempt_ids:
        with db.write() as s:
            move = _claim_move(s.get(Attempt, attempt_id), reclaim, utcnow())
            if move is None:
                continue
            try:
                move_attempt(s, move.row, A.LAUNCHING, expect=move.expect, where=Attempt.fence == move.fence,
                             why=move.why, **move.values)
            except IllegalTransition:  # moved by another process first; move_attempt wrote nothing
                continue
            fences[attempt_id] = move.values["fence"]
    return fences


def _claim_move(a: Attempt, reclaim: bool, now: Any) -> Move | None:
    """The claim of ``a`` (pending, or with ``reclaim`` an expired launching claim), or None."""
    fence = (a.fence or 0) + 1
    if a.state is A.PENDING:
        why = f"claimed (fence {fence})"
    elif reclaim and a.state is A.LAUNCHING and claim_expired(a.claimed_at, now, launch_grace_s()):
        why = f"re-claimed after the claim expired (fence {fence})"
    else:
        return None
    return Move(a, a.state, A.LAUNCHING, {"claimed_at": now, "fence": fence}, fenced=True, fence=a.fence, why=why)


def _keeper(db: Database) -> ClaimKeeper:
    return ClaimKeeper(lambda claims: renew_claims(db, claims))


def renew_claims(db: Database, claims: list[tuple[int, int]]) -> set[int]:
    """claimed_at = now for each (attempt id, fence) whose attempt is still ``launching`` under that fence,
    in one transaction; the ids still held."""
    held: set[int] = set()
    if not claims:
        return held
    with db.write() as s:
        now = utcnow()
        for attempt_id, fence in claims:
            res = s.execute(update(Attempt).where(Attempt.id == attempt_id, Attempt.state == A.LAUNCHING,
                                                  Attempt.fence == fence)
                            .values(claimed_at=now).execution_options(synchronize_session=False))
            if res.rowcount == 1:
                held.add(attempt_id)
    return held


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
    fence = _claim(db, rd.attempt_id, reclaim)
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
        _close_verified(db, rd.attempt_id, rd.job_id)
        return Launched(outcome=LaunchOutcome.VERIFIED)
    return _Ready(rd, spec, moved, fence)


def prepare_failed(db: Database, cfg: Config, name: str, attempt_id: int, e: Exception) -> NoReturn:
    """``check_and_prepare`` raised ``e`` under this launcher's claim: the attempt ends with the reason, then
    Refused (for good: invalid) or OrchError (a filesystem error: its retryable class) is raised."""
    if isinstance(e, (Refused, protocol.UnsafePath)):
        _fail(db, cfg, attempt_id, FailureClass.INVALID, f"refused: {e}")
        raise Refused(f"refused: {name}: {e}") from None
    assert isinstance(e, OSError)
    _fail_os(db, cfg, attempt_id, e)
    raise OrchError(f"{name}: launch failed: {e.strerror or e}"
                    + (f": {e.filename}" if getattr(e, "filename", None) else "")) from None


def _fail_os(db: Database, cfg: Config, attempt_id: int, e: OSError) -> None:
    _fail(db, cfg, attempt_id, _launch_error_class(e), f"launch failed: {e}")


def _launch_error_class(e: BaseException) -> FailureClass:
    """A launch's OSError before the program ran: a full disk (enospc), a storage fault that may pass (storage:
    retried after a back-off, never counted), else unknown (waits for a person: EACCES, ELOOP, ...)."""
    cls = protocol.write_error_class(e)
    return FailureClass.UNKNOWN if cls == "crash" else FailureClass(cls)


def launch(db: Database, cfg: Config, name: str, backend: Backend | None = None, *,
           reclaim: bool = False) -> Launched:
    """Launch the job's pending attempt (``reclaim``: or its expired launching one).

    Raises Refused when the attempt was refused for good (the attempt and job are failed first),
    OrchError for a launch that failed (the attempt is ended with its class, or, for a transient
    scheduler error, left to the reconciler).
    """
    with _keeper(db) as keeper:
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
    lost = _check_claim(db, r.attempt_id, r.fence)
    if lost is not None:
        return Launched(moved=r.moved, outcome=lost)
    testhooks.site("fence_checked")
    try:
        external_id = backend.submit(with_exclusion(db, cfg, backend, r.spec))

    except (BackendError, OSError) as e:
        _submission_failed(db, cfg, [r], e)
    testhooks.site("after_backend_submit")
    return _record_own(db, backend, r, external_id)


def _record_own(db: Database, backend: Backend, r: _Ready | Held, external_id: str, *,
                cancel: bool = True) -> Launched:
    """Record this launcher's submission, if its claim still stands (compare-and-set on its fence).
    ``cancel=False``: the submission to stop, if any, was stopped already (``quicksubmit.stop_overtaken``)."""
    try:
        stopped = record_submitted(db, r.attempt_id, external_id, r.overrides, backend=backend, fence=r.fence,
                                   cancel=cancel)
    except LostClaim as e:
        return Launched(external_id, r.moved, LaunchOutcome.LOST_CLAIM, str(e))
    return Launched(external_id, r.moved, LaunchOutcome.STOPPED if stopped else LaunchOutcome.SUBMITTED)


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
    with _keeper(db) as keeper:  # every member's claim is renewed until all are prepared
        reads = _read_group(db, cfg, names, backend.name, results)
        fences = _claim_all(db, [rd.attempt_id for rd in reads], reclaim)
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
    lost = _check_claims(db, [(r.attempt_id, r.fence) for r in ready])
    for r in ready:
        if lost[r.attempt_id] is not None:
            results[r.name] = Launched(moved=r.moved, outcome=lost[r.attempt_id])
        else:
            groups.setdefault(r.spec.batch, []).append(r)  # one batch per (resources, signal, env), above
    testhooks.site("fence_checked")
    for batch_token, members in groups.items():
        marked = _mark_batch(db, [r.attempt_id for r in members], batch_token)
        members = [r for r in members if r.attempt_id in marked]
        try:
            exclude = exclusion_for(db, cfg, backend, members[0].spec.resources) if members else ()
            ids = backend.submit_group([dataclasses.replace(r.spec, exclude_nodes=exclude) for r in members],
                                       batch_token, throttle)
        except (BackendError, OSError) as e:
            try:
                _submission_failed(db, cfg, members, e)
            except OrchError as err:
                for r in members:
                    results[r.name] = err
            continue
        testhooks.site("after_backend_submit")
        results.update(_record_group(db, backend, members, ids))
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


def group_write_failed(db: Database, cfg: Config, ready: list[_Ready] | list[Held],
                       results: dict[str, Launched | OrchError], e: OSError) -> None:
    for r in ready:
        _fail_os(db, cfg, r.attempt_id, e)
        results[r.name] = OrchError(f"{r.name}: launch failed: {e.strerror or e}")


def _mark_batch(db: Database, attempt_ids: list[int], batch: str) -> set[int]:
    """Record the group's token on each attempt still launching, in one transaction; the ids marked."""
    with db.write() as s:
        rows = _preload(s, attempt_ids, jobs=True)
        moves = [Move(a, A.LAUNCHING, None, {"batch_token": batch})
                 for a in (rows[i] for i in attempt_ids) if a.state is A.LAUNCHING]
        # A relaunch under a new batch (the old one's launcher stopped or stalled, and its array was not found):
        # the room the old batch's pool held for the task is given back; an old wrapper that does start after
        # all finds this launch's fence and runs nothing (launchprep.BatchRecords).
        earlier = [(rows["job", m.row.job_id].run_dir, m.row.batch_token, rows["job", m.row.job_id].task_index)
                   for m in moves if m.row.batch_token and m.row.batch_token != batch]
        move_many(s, moves)
        marked = {m.row.id for m in moves}
    for run_dir, old, task in earlier:
        if task is not None:
            give_back(Path(run_dir), old, task)
    return marked


class LostClaim(OrchError):
    """This launcher's claim was taken over (it stopped or stalled past the launch grace)."""


def _check_claim(db: Database, attempt_id: int, fence: int) -> LaunchOutcome | None:
    """Right before the backend call: None while the attempt is still ``launching`` under this
    launcher's fence (the claim is renewed, and the generation noted as the one that may have called
    the backend), else the outcome: ``stopped`` (orch cancel came first: closed unlaunched) or
    ``lost_claim`` (a re-claimer has it: this launcher must not submit a second copy)."""
    return _check_claims(db, [(attempt_id, fence)])[attempt_id]


def _check_claims(db: Database, claims: list[tuple[int, int]]) -> dict[int, LaunchOutcome | None]:
    """``_check_claim`` of many (attempt id, fence) claims in one transaction."""
    out: dict[int, LaunchOutcome | None] = {}
    if not claims:
        return out
    with db.write() as s, s.no_autoflush:
        rows = _preload(s, [attempt_id for attempt_id, _ in claims])
        now, held = utcnow(), []
        for attempt_id, fence in claims:
            a = rows[attempt_id]
            if a.fence != fence:
                out[attempt_id] = LaunchOutcome.LOST_CLAIM
            elif a.state is A.STOPPING:  # a cancel that landed while this launcher prepared the run dir
                move_attempt(s, a, A.CANCELLED, where=Attempt.fence == fence, failure_class=FailureClass.CANCELLED,
                             detail="cancelled during its launch, before the backend call")
                out[attempt_id] = LaunchOutcome.STOPPED
            elif a.state is A.LAUNCHING:
                held.append(Move(a, A.LAUNCHING, None, {"claimed_at": now, "launched_fence": fence},
                                 fenced=True, fence=fence))
                out[attempt_id] = None
            else:
                out[attempt_id] = LaunchOutcome.LOST_CLAIM
        move_many(s, held)  # rows read in this transaction: every guard holds, or all of it rolls back
    return out


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


def _submission_failed(db: Database, cfg: Config, members: list[_Ready] | list[Held], e: Exception) -> NoReturn:
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
                # Under this launcher's own claim only: unguarded, a stale launcher's note overwrote the
                # detail of the launch that had re-claimed the attempt.
                set_attempt_fields(s, s.get(Attempt, r.attempt_id), A.LAUNCHING, where=Attempt.fence == r.fence,
                                   detail=f"submission failed (will be retried): {e}"[:2000])
        raise OrchError(f"{names}: {e}") from None
    # An OSError before the scheduler was asked (the batch script could not be written): nothing
    # was submitted.
    cls = _launch_error_class(e)
    for r in members:
        _fail(db, cfg, r.attempt_id, cls, f"launch failed: {e}")
    raise OrchError(f"{names}: launch failed: {getattr(e, 'strerror', None) or e}") from None


def _close_verified(db: Database, attempt_id: int, job_id: int) -> None:
    """A requeue raced a job that finished after all: never rerun a verified result; the unlaunched
    attempt is closed too (it stayed ``submitted`` for ever)."""
    with db.write() as s:
        a, job = s.get(Attempt, attempt_id), s.get(Job, job_id)
        if a.state in (A.LAUNCHING, A.STOPPING):
            move_attempt(s, a, A.CANCELLED, detail="not launched: the run dir's marker verifies")
        if job.state is not J.DONE:
            move_job(s, job, J.DONE, "marker verified before launch")


def _fail(db: Database, cfg: Config, attempt_id: int, cls: FailureClass, detail: str) -> None:
    # Imported here: a launch that goes well never ends an attempt, and ending (with observe, which held
    # STOP_GRACE_S) was ~3 ms of every `orch submit`'s imports.
    from orchestrator.ops.attemptend import finish

    finish(db, cfg, attempt_id, None, launch_failure=(cls, detail))


def record_submitted(db: Database, attempt_id: int, external_id: str, overrides: dict[str, Any] | None = None,
                     *, backend: Backend | None = None, fence: int | None = None, cancel: bool = True) -> bool:
    """launching -> submitted with the backend's id (job pending -> submitted).

    If ``orch cancel`` overtook the launch (the attempt is already ``stopping``), the id is recorded
    and the new job stopped at once; returns True then (a cancel that landed during the
    launch left the job running). ``fence``: only while the attempt is still under this launcher's
    claim; raises LostClaim otherwise (a re-claimer's launch or adoption is the attempt's).
    """
    with db.write() as s:
        rec = _record_in(s, attempt_id, external_id, overrides, fence)
    if rec.cancel is not None and cancel:
        (backend or get_backend(rec.backend)).cancel([rec.cancel])
    if rec.lost:
        raise LostClaim(rec.lost)
    return rec.stopped


@dataclass
class _Recorded:
    """What ``_record_in`` did: ``lost`` (why this launcher's claim was gone), ``stopped`` (a cancel
    came first), ``cancel`` (the submission to cancel once the transaction has committed)."""

    backend: str
    lost: str = ""
    stopped: bool = False
    cancel: AttemptRef | None = None


def _record_in(s: Any, attempt_id: int, external_id: str, overrides: dict[str, Any] | None,
               fence: int | None) -> _Recorded:
    """``record_submitted``'s writes, in the caller's write transaction (nothing raised: the caller acts)."""
    a = s.get(Attempt, attempt_id)
    job = s.get(Job, a.job_id)
    out = _Recorded(job.backend)
    if fence is not None and a.fence != fence:
        out.lost = (f"lost its launch claim (generation {fence}, now {a.fence}) during the backend call; "
                    f"its submission {external_id} runs nothing (its wrapper's fence is stale)")
        if a.external_id not in (None, external_id):
            out.cancel = attempt_ref(a, job, external_id)  # the attempt runs under another id: ours is dropped
            out.lost += "; it was cancelled"
        # else: the re-claimer may yet adopt it: left alone
    elif a.state is A.LAUNCHING:
        extra = {"overrides": overrides} if overrides is not None else {}
        move_attempt(s, a, A.SUBMITTED, where=Attempt.fence == a.fence, why=f"submitted as {external_id}",
                     external_id=external_id, submitted_at=utcnow(), **extra)
        if job.state is J.PENDING:
            move_job(s, job, J.SUBMITTED, f"attempt {a.n} submitted as {external_id}")
    elif a.state is A.STOPPING and a.external_id is None:
        set_attempt_fields(s, a, A.STOPPING, external_id=external_id, submitted_at=utcnow())
        out.stopped, out.cancel = True, attempt_ref(a, job, external_id)
    return out


def _record_group(db: Database, backend: Backend, members: list[_Ready] | list[Held], ids: dict[str, str], *,
                  cancel: bool = True) -> dict[str, Launched]:
    """``_record_own`` of every member of one group submission, in one transaction; the cancels it calls
    for (a cancel that came first, a claim lost to a re-claimer) go out after it in one backend call
    (``cancel=False``: they went out already, ``quicksubmit.stop_overtaken``)."""
    recs: dict[str, _Recorded] = {}
    with db.write() as s, s.no_autoflush:
        rows = _preload(s, [r.attempt_id for r in members], jobs=True)
        moves, now = [], utcnow()
        for r in members:
            a, ext = rows[r.attempt_id], ids[r.spec.token]
            job = rows["job", a.job_id]
            if a.fence != r.fence or a.state is not A.LAUNCHING:  # lost, or a cancel came first: one by one
                recs[r.name] = _record_in(s, r.attempt_id, ext, r.overrides, r.fence)
                continue
            moves.append(Move(a, A.LAUNCHING, A.SUBMITTED, {"external_id": ext, "submitted_at": now,
                                                            "overrides": r.overrides},
                              fenced=True, fence=a.fence, why=f"submitted as {ext}"))
            if job.state is J.PENDING:
                moves.append(Move(job, J.PENDING, J.SUBMITTED, why=f"attempt {a.n} submitted as {ext}"))
            recs[r.name] = _Recorded(job.backend)
        move_many(s, moves)  # rows read in this transaction: every guard holds, or all of it rolls back
    cancels = [rec.cancel for rec in recs.values() if rec.cancel is not None]
    if cancels and cancel:
        backend.cancel(cancels)
    out: dict[str, Launched] = {}
    for r in members:
        rec, ext = recs[r.name], ids[r.spec.token]
        if rec.lost:
            out[r.name] = Launched(ext, r.moved, LaunchOutcome.LOST_CLAIM, rec.lost)
        else:
            out[r.name] = Launched(ext, r.moved, LaunchOutcome.STOPPED if rec.stopped else LaunchOutcome.SUBMITTED)
    return out
