"""What a launch records: the backend's id once it took the submission, or why the attempt ended unlaunched.

``record_submitted`` moves ``launching -> submitted`` only under the launcher's own fence (``LostClaim``
otherwise: a re-claimer's launch or adoption is the attempt's), and honours a cancel that landed during the
launch. Every failure before or at the backend call ends the attempt with its class (``submission_failed``,
``prepare_failed``): a refusal is ``invalid``, a filesystem error its retryable class, and only a transient
scheduler error keeps the claim for the reconciler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

from orchestrator import protocol
from orchestrator.backends import get_backend
from orchestrator.backends.base import AttemptRef, Backend, BackendError, SubmitSpec
from orchestrator.core import transactions
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import attempt_ref
from orchestrator.core.lifecycle import (
    AttemptState,
    JobState,
    move_attempt,
    move_job,
    set_attempt_fields,
    utcnow,
)
from orchestrator.core.models import Attempt, Job
from orchestrator.errors import IllegalTransition, OrchError, Refused
from orchestrator.jobside.ballast import give_back
from orchestrator.ops.launchclaim import Launched, LaunchOutcome, LostClaim, preload
from orchestrator.ops.statements import SessionExecutor
from orchestrator.protocol import FailureClass

A, J = AttemptState, JobState


class Member(Protocol):
    """A claimed, prepared attempt as the recorders read it (``launch``'s ready attempts, the quick paths'
    ``launchprep.Held``)."""

    @property
    def name(self) -> str: ...
    @property
    def attempt_id(self) -> int: ...
    @property
    def overrides(self) -> dict[str, Any]: ...

    fence: int
    spec: SubmitSpec
    moved: list[str]


def prepare_failed(db: Database, cfg: Config, name: str, attempt_id: int, e: Exception) -> NoReturn:
    """``check_and_prepare`` raised ``e`` under this launcher's claim: the attempt ends with the reason, then
    Refused (for good: invalid) or OrchError (a filesystem error: its retryable class) is raised."""
    if isinstance(e, (Refused, protocol.UnsafePath)):
        fail(db, cfg, attempt_id, FailureClass.INVALID, f"refused: {e}")
        raise Refused(f"refused: {name}: {e}") from None
    assert isinstance(e, OSError)
    fail_os(db, cfg, attempt_id, e)
    raise OrchError(f"{name}: launch failed: {e.strerror or e}"
                    + (f": {e.filename}" if getattr(e, "filename", None) else "")) from None


def fail_os(db: Database, cfg: Config, attempt_id: int, e: OSError) -> None:
    fail(db, cfg, attempt_id, launch_error_class(e), f"launch failed: {e}")


def launch_error_class(e: BaseException) -> FailureClass:
    """A launch's OSError before the program ran: a full disk (enospc), a storage fault that may pass (storage:
    retried after a back-off, never counted), else unknown (waits for a person: EACCES, ELOOP, ...)."""
    cls = protocol.write_error_class(e)
    return FailureClass.UNKNOWN if cls == "crash" else FailureClass(cls)


def record_own(db: Database, backend: Backend, r: Member, external_id: str, *,
                cancel: bool = True) -> Launched:
    """Record this launcher's submission, if its claim still stands (compare-and-set on its fence).
    ``cancel=False``: the submission to stop, if any, was stopped already (``quicksubmit.stop_overtaken``)."""
    try:
        stopped = record_submitted(db, r.attempt_id, external_id, r.overrides, backend=backend, fence=r.fence,
                                   cancel=cancel)
    except LostClaim as e:
        return Launched(external_id, r.moved, LaunchOutcome.LOST_CLAIM, str(e))
    return Launched(external_id, r.moved, LaunchOutcome.STOPPED if stopped else LaunchOutcome.SUBMITTED)


def group_write_failed(db: Database, cfg: Config, ready: list[Member],
                       results: dict[str, Launched | OrchError], e: OSError) -> None:
    for r in ready:
        fail_os(db, cfg, r.attempt_id, e)
        results[r.name] = OrchError(f"{r.name}: launch failed: {e.strerror or e}")


def mark_batch(db: Database, attempt_ids: list[int], batch: str) -> set[int]:
    """Record the group's token on each attempt still launching, in one transaction; the ids marked."""
    with db.write() as s:
        rows = preload(s, attempt_ids, jobs=True)
        launching = [a for a in (rows[i] for i in attempt_ids) if a.state is A.LAUNCHING]
        # A relaunch under a new batch (the old one's launcher stopped or stalled, and its array was not found):
        # the room the old batch's pool held for the task is given back; an old wrapper that does start after
        # all finds this launch's fence and runs nothing (launchprep.BatchRecords).
        earlier = [(rows["job", a.job_id].run_dir, a.batch_token, rows["job", a.job_id].task_index)
                   for a in launching if a.batch_token and a.batch_token != batch]
        # rows read in this transaction: every one is marked, or all of it rolls back
        if not transactions.mark_batch(SessionExecutor(s), [transactions.Held(a.job_id, a.id, a.fence)
                                                            for a in launching], batch):
            raise IllegalTransition("an attempt moved under us")
        marked = {a.id for a in launching}
    for run_dir, old, task in earlier:
        if task is not None:
            give_back(Path(run_dir), old, task)
    return marked


def submission_failed(db: Database, cfg: Config, members: list[Member], e: Exception) -> NoReturn:
    """The backend call failed for these attempts: raise, after recording what the failure means."""
    names = ", ".join(r.name for r in members)
    if isinstance(e, BackendError) and e.permanent:
        # The scheduler will never take it (bad partition...): failed now, not retried forever.
        for r in members:
            fail(db, cfg, r.attempt_id, FailureClass.INVALID, f"the scheduler refused the submission: {e}")
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
    cls = launch_error_class(e)
    for r in members:
        fail(db, cfg, r.attempt_id, cls, f"launch failed: {e}")
    raise OrchError(f"{names}: launch failed: {getattr(e, 'strerror', None) or e}") from None


def close_verified(db: Database, attempt_id: int, job_id: int) -> None:
    """A requeue raced a job that finished after all: never rerun a verified result; the unlaunched
    attempt is closed too (it stayed ``submitted`` for ever)."""
    with db.write() as s:
        a, job = s.get(Attempt, attempt_id), s.get(Job, job_id)
        if a.state in (A.LAUNCHING, A.STOPPING):
            move_attempt(s, a, A.CANCELLED, detail="not launched: the run dir's marker verifies")
        if job.state is not J.DONE:
            move_job(s, job, J.DONE, "marker verified before launch")


def fail(db: Database, cfg: Config, attempt_id: int, cls: FailureClass, detail: str) -> None:
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
        rec = record_in(s, attempt_id, external_id, overrides, fence)
    if rec.cancel is not None and cancel:
        (backend or get_backend(rec.backend)).cancel([rec.cancel])
    if rec.lost:
        raise LostClaim(rec.lost)
    return rec.stopped


@dataclass
class Recorded:
    """What ``record_in`` did: ``lost`` (why this launcher's claim was gone), ``stopped`` (a cancel
    came first), ``cancel`` (the submission to cancel once the transaction has committed)."""

    backend: str
    lost: str = ""
    stopped: bool = False
    cancel: AttemptRef | None = None


def record_in(s: Any, attempt_id: int, external_id: str, overrides: dict[str, Any] | None,
               fence: int | None) -> Recorded:
    """``record_submitted``'s writes, in the caller's write transaction (nothing raised: the caller acts)."""
    a = s.get(Attempt, attempt_id)
    job = s.get(Job, a.job_id)
    out = Recorded(job.backend)
    if fence is not None and a.fence != fence:
        out.lost = (f"lost its launch claim (generation {fence}, now {a.fence}) during the backend call; "
                    f"its submission {external_id} runs nothing (its wrapper's fence is stale)")
        if a.external_id not in (None, external_id):
            out.cancel = attempt_ref(a, job, external_id)  # the attempt runs under another id: ours is dropped
            out.lost += "; it was cancelled"
        # else: the re-claimer may yet adopt it: left alone
    elif a.state is A.LAUNCHING and job.state is J.PENDING:  # as always: the job waits for its attempt
        sub = transactions.Submission(transactions.Held(job.id, a.id, a.fence), external_id,
                                      a.overrides if overrides is None else overrides, a.n)
        if not transactions.record_submitted(SessionExecutor(s), [sub], utcnow()):
            raise IllegalTransition(f"attempt {a.n}: state changed under us (expected launching)")
    elif a.state is A.LAUNCHING:  # its job moved on without it (not reached today: a cancel stops the attempt too)
        extra = {"overrides": overrides} if overrides is not None else {}
        move_attempt(s, a, A.SUBMITTED, where=Attempt.fence == a.fence, why=f"submitted as {external_id}",
                     external_id=external_id, submitted_at=utcnow(), **extra)
    elif a.state is A.STOPPING and a.external_id is None:
        set_attempt_fields(s, a, A.STOPPING, external_id=external_id, submitted_at=utcnow())
        out.stopped, out.cancel = True, attempt_ref(a, job, external_id)
    return out


def record_group(db: Database, backend: Backend, members: list[Member], ids: dict[str, str], *,
                  cancel: bool = True) -> dict[str, Launched]:
    """``record_own`` of every member of one group submission, in one transaction; the cancels it calls
    for (a cancel that came first, a claim lost to a re-claimer) go out after it in one backend call
    (``cancel=False``: they went out already, ``quicksubmit.stop_overtaken``)."""
    recs: dict[str, Recorded] = {}
    with db.write() as s, s.no_autoflush:
        rows = preload(s, [r.attempt_id for r in members], jobs=True)
        subs = []
        for r in members:
            a, ext = rows[r.attempt_id], ids[r.spec.token]
            job = rows["job", a.job_id]
            if a.fence != r.fence or a.state is not A.LAUNCHING or job.state is not J.PENDING:
                recs[r.name] = record_in(s, r.attempt_id, ext, r.overrides, r.fence)  # lost, a cancel: one by one
                continue
            subs.append(transactions.Submission(transactions.Held(job.id, a.id, a.fence), ext, r.overrides, a.n))
            recs[r.name] = Recorded(job.backend)
        # rows read in this transaction: every guard holds, or all of it rolls back
        if not transactions.record_submitted(SessionExecutor(s), subs, utcnow()):
            raise IllegalTransition("an attempt moved under us")
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
