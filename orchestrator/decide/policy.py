"""Failure class -> what the next attempt does differently (a ``RetryPlan``), with per-class caps.

The runbook's recovery commands (seed 002), done by policy instead of by hand at 3 a.m.:
OOM -> more memory; NaN -> roll back to an earlier verified checkpoint, halve the LR, skip the
suspect batches, quarantine the later checkpoints; disk full -> prune old checkpoints, empty the
trash; preemption / time limit / node failure -> resume, not counted against --max-attempts.

Overrides reach every program, the bundled trainer included, as JSON in ORCH_OVERRIDES; the command
is never changed (the bundled trainer was recognised by ``-m trainer`` in argv, so a user's
own module named ``trainer`` got ``--lr``/``--resume`` appended; docs/decisions/0006-overrides-not-argv.md).
``plan.overrides`` (lr, micro-batch, data offset) and ``plan.resources`` (memory) stay for every later
attempt; ``plan.resume`` applies to the next only.

Every checkpoint a plan names has had its sha256 verified here first (a bit flip that kept
the size made a NaN rollback resume from a checkpoint the trainer then refused, and the job failed
for good). A corrupt one is quarantined, and the next older verified one is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.lifecycle import JobState, utcnow
from orchestrator.core.models import Attempt, Job
from orchestrator.core.retryplan import Action, RetryPlan
from orchestrator.protocol import FailureClass, FailureReport, Fault, finite_number

C = FailureClass

# Whose failure a class is: FailureClass.fault. RUN: the job's own failures, which the no-progress guard
# counts (NVIDIA's resiliency tools stop after 3). PLATFORM: never counted against --max-attempts,
# and no break in a run of own failures.
STEP_KEY = "checkpoint_step"  # plan details: the newest committed checkpoint step when the attempt ended
_UNKNOWN = object()  # an attempt decided before STEP_KEY was recorded: it proves nothing either way


@dataclass(frozen=True)
class Decision:
    state: JobState  # retryable_failed, failed or cancelled
    plan: RetryPlan  # recorded on the attempt (orch show: action) and carried to the next one
    counted: bool  # counts against --max-attempts
    cls: FailureClass | None = None  # the attempt's class when the policy concluded another (no_progress, invalid)


def decide(cfg: Config, job: Job, attempt: Attempt, cls: FailureClass, step: int | None,
           report: FailureReport | None, *, never_launched: bool = False) -> Decision:
    """What to do after ``attempt`` of ``job`` ended with class ``cls`` (attempt is the last one).

    ``never_launched``: the attempt failed before it reached the backend (its program never ran).
    Every plan records the newest committed checkpoint step (names only, no hashing) in its details,
    so later decisions can tell whether the attempts in between made progress.

    Hashes checkpoints (NaN, requeue plans): call it outside a DB write transaction.
    """
    return _decide(cfg, job, attempt, C(cls), step, report, never_launched, newest_checkpoint_step(Path(job.run_dir)))


def _decide(cfg: Config, job: Job, attempt: Attempt, cls: FailureClass, step: int | None, report: FailureReport | None,
            never_launched: bool, ckpt: int | None) -> Decision:
    def done(state: JobState, plan: RetryPlan, counted: bool, as_cls: FailureClass | None = None) -> Decision:
        return Decision(state, plan.with_(details={**plan.details_dict, STEP_KEY: ckpt}), counted, as_cls)

    # Preemptions and node failures never count, whatever policy.uncounted says: docs/concepts/failures.md's table is
    # the contract (preempted 3 times at one step with --max-attempts 2 ended failed).
    counted = cls not in cfg.uncounted and cls.fault is not Fault.PLATFORM
    if cls is C.CANCELLED:
        return done(JobState.CANCELLED, RetryPlan.make(Action.NONE, why="cancelled"), False)
    if cls is C.INVALID:
        return done(JobState.FAILED, RetryPlan.make(Action.GIVE_UP, why="invalid: retrying cannot help"), counted)
    prior = [a for a in job.attempts if a.id != attempt.id and a.n < attempt.n]
    history = [(C(a.failure_class) if a.failure_class else None, _recorded_step(a)) for a in prior] + [(cls, ckpt)]
    # A launch onto a full disk: the program never ran, so none of its attempts was used. Counted, three
    # passes burned every attempt within seconds and a retryable failure became permanent (hostile test).
    # The same when a retry made no progress before the disk stopped it (the trainer's own
    # free-space check at start-up, attempts 2 and 3 requeued at once and counted: failed 8 s after another process
    # filled the disk). A first attempt that filled the disk itself is the program's: counted, resumed at once.
    full_at_launch = cls is C.ENOSPC and (never_launched or (
        len(history) > 1 and _advanced(history, len(history) - 1) is False))
    if full_at_launch:
        counted = False
    proven = _proven_permanent(cfg, job, cls, prior, history, counted, full_at_launch)
    if proven is not None:
        return done(JobState.FAILED, RetryPlan.make(Action.GIVE_UP, why=proven[1]), counted, proven[0])
    plan = _next_plan(cfg, job, cls, step, report, prior, history, full_at_launch)
    if plan.action is Action.GIVE_UP:
        return done(JobState.FAILED, plan, counted)
    return done(JobState.RETRYABLE_FAILED, plan, counted)


def _proven_permanent(cfg: Config, job: Job, cls: FailureClass, prior: list[Attempt],
                      history: list[tuple[FailureClass | None, object]], counted: bool,
                      full_at_launch: bool) -> tuple[FailureClass | None, str] | None:
    """(class to record instead, or None; why) when the job has now failed for good, else None."""
    used = sum(1 for a in prior if a.counted) + (1 if counted else 0)
    if counted and used >= job.max_attempts:
        return None, f"{used} of {job.max_attempts} attempts used"
    ckpt = history[-1][1]
    stalled = _own_failures_without_progress(history)
    if cls.fault is Fault.RUN and cfg.no_progress_attempts and stalled >= cfg.no_progress_attempts \
            and not full_at_launch:  # a full disk is not the program's failure to progress
        # A 1 s time limit never gets past start-up: free resumes looped for ever (then counted, which made
        # preemptions count too). Now the job's own failures end it once the checkpoint stops advancing.
        at = f"at step {ckpt}" if ckpt is not None else "none"
        return C.NO_PROGRESS, (f"no_progress: the newest checkpoint stayed {at} over the last {stalled} attempts "
                               f"(policy.no_progress_attempts = {cfg.no_progress_attempts})")
    if cls is C.INPUT_MISSING and (n := _trailing(history, {C.INPUT_MISSING})) >= cfg.input_missing_attempts:
        # Proven now: missing at start on N attempts in a row, each with its own evidence (the path) in its
        # detail. One observation is not proof: an NFS hiccup made a resuming job failed for good.
        return C.INVALID, (f"invalid: an input was missing at start on {n} consecutive attempts "
                           f"(policy.input_missing_attempts = {cfg.input_missing_attempts})")
    same = sum(1 for a in prior if a.failure_class == cls) + 1
    cap = cfg.caps.get(cls)
    if cap is not None and same > cap and not full_at_launch:
        return None, f"{cls} {same} times (cap {cap})"
    return None


def _next_plan(cfg: Config, job: Job, cls: FailureClass, step: int | None, report: FailureReport | None,
               prior: list[Attempt], history: list[tuple[FailureClass | None, object]],
               full_at_launch: bool) -> RetryPlan:
    """What the next attempt does differently (a ``give_up`` plan when nothing can help, e.g. OOM at the cap)."""
    auto = cls in cfg.auto_requeue
    run_dir = Path(job.run_dir)
    plan = RetryPlan.make(Action.RESUME, auto=auto)
    if cls is C.NAN:
        return _nan(cfg, job, run_dir, step, report, plan)
    if cls is C.OOM:
        return _oom(cfg, job, plan)
    if cls is C.ENOSPC:
        plan = _enospc(cfg, run_dir, plan)
        if full_at_launch:  # retried every pass it would hammer a full disk: back off, up to an hour
            plan = _backoff(cfg, plan, sum(1 for a in prior if a.failure_class == cls) + 1)
        return plan
    if cls in (C.CRASH, C.KILLED):  # killed: auto by default, backed off like crash, counted, capped
        if not auto:
            return plan.with_(why="waits for `orch requeue`")
        return _backoff(cfg, plan, sum(1 for a in prior if a.failure_class == cls) + 1)
    if cls in (C.INPUT_MISSING, C.STORAGE):  # a fault of storage that may pass: longer each time in a row
        return _backoff(cfg, plan, _trailing(history, {cls}))
    if cls.fault is Fault.PLATFORM and (k := _transient_without_progress(history)):
        # preempted again and again at one step (a busy partition): wait longer each time, never give up for it
        return _backoff(cfg, plan, k)
    return plan


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """The newest committed checkpoint's step, from directory names only (no hashing: every attempt's
    end calls this); None when there is none (or checkpoints/ cannot be read)."""
    try:
        newest = next(protocol.iter_checkpoint_dirs(run_dir), None)
    except OSError:
        return None
    return protocol.checkpoint_step(newest) if newest is not None else None


def _recorded_step(a: Attempt) -> object:
    details = a.action.details_dict if a.action is not None else {}
    v = details.get(STEP_KEY, _UNKNOWN)
    return v if v is None or v is _UNKNOWN or protocol.is_int(v, 0) else _UNKNOWN


def _advanced(history: list[tuple[FailureClass | None, object]], i: int) -> bool | None:
    """Whether attempt ``i`` ended with a newer checkpoint than attempt ``i - 1`` (the first: than none);
    None when either step was not recorded (that proves nothing)."""
    end = history[i][1]
    before = history[i - 1][1] if i > 0 else None
    if end is _UNKNOWN or before is _UNKNOWN:
        return None
    return end is not None and (before is None or end > before)  # type: ignore[operator]


def _own_failures_without_progress(history: list[tuple[FailureClass | None, object]]) -> int:
    """How many of the job's own failures in a row, newest first, ended without a newer checkpoint.
    Preemptions and node failures in between are skipped; any other class, or progress, ends the run."""
    n = 0
    for i in range(len(history) - 1, -1, -1):
        cls = history[i][0]
        if _advanced(history, i) is not False:
            break
        if cls is not None and cls.fault is Fault.RUN:
            n += 1
        elif cls is None or cls.fault is not Fault.PLATFORM:
            break
    return n


def _transient_without_progress(history: list[tuple[FailureClass | None, object]]) -> int:
    """How many preemptions/node failures in a row, newest first, ended without a newer checkpoint than
    the attempt before; the first attempt has no earlier one to compare with and never counts."""
    n = 0
    for i in range(len(history) - 1, 0, -1):
        cls = history[i][0]
        if cls is None or cls.fault is not Fault.PLATFORM or _advanced(history, i) is not False:
            break
        n += 1
    return n


def _trailing(history: list[tuple[FailureClass | None, object]], classes: set[FailureClass]) -> int:
    """How many attempts in a row, newest first, ended with one of ``classes``."""
    n = 0
    for cls, _step in reversed(history):
        if cls not in classes:
            break
        n += 1
    return n


def _backoff(cfg: Config, plan: RetryPlan, k: int) -> RetryPlan:
    """No auto-requeue before crash_backoff_s x 2**(k-1), at most policy.backoff_cap_s (k >= 1)."""
    backoff = min(cfg.crash_backoff_s * 2 ** min(k - 1, 40), cfg.backoff_cap_s)
    return plan.with_(not_before=utcnow() + timedelta(seconds=backoff),
                      details={**plan.details_dict, "backoff_s": backoff})


def checkpoints_by_verification(run_dir: Path) -> tuple[list[tuple[int, Path]], list[str]]:
    """(verified checkpoints newest first, run-dir paths of committed-name ones that do not verify).

    Full sha256 for a small single-writer checkpoint (a same-size bit flip passes a size check); the
    manifest and sizes for a sharded or large one, whose loader hashes every byte (``verify_checkpoint_bounded``).
    """
    good, bad = [], []
    for p in protocol.iter_checkpoint_dirs(run_dir):
        if protocol.verify_checkpoint_bounded(p) is None:
            good.append((protocol.checkpoint_step(p) or 0, p))
        else:
            bad.append(f"{protocol.CHECKPOINTS_DIR}/{p.name}")
    return good, bad


def _nan(cfg: Config, job: Job, run_dir: Path, step: int | None, report: FailureReport | None,
         plan: RetryPlan) -> RetryPlan:
    """Roll back to the newest verified checkpoint at least K steps before the bad step, LR x0.5."""
    rc = protocol.read_run_config(run_dir)
    ckpts, corrupt = checkpoints_by_verification(run_dir)
    limit = (step - cfg.nan_rollback_steps) if step is not None else None
    good = [(s, p) for s, p in ckpts if limit is None or s <= limit]
    resume_step = good[0][0] if good else 0
    quarantine = corrupt + [f"{protocol.CHECKPOINTS_DIR}/{p.name}" for s, p in ckpts if not good or s > resume_step]
    overrides: dict[str, Any] = {}
    # The base LR (what --lr set), never the report's scheduled LR of that step: halving a warmup
    # value would compound with the schedule on resume.
    lr = _num(job.overrides.get("lr")) or _num(rc.get("lr")) or (report.lr if report is not None else None)
    if lr is not None:
        overrides["lr"] = lr * cfg.nan_lr_factor
    if step is not None:
        # Data offset is absolute (batches skipped since step 0): add the batches from the resume
        # point up to and including the bad one, so the retry never sees them again.
        prev = int(_num(job.overrides.get("skip_batches")) or _num(rc.get("skip_batches")) or 0)
        overrides["skip_batches"] = prev + max(1, step - resume_step)
    resume = f"{protocol.CHECKPOINTS_DIR}/{good[0][1].name}" if good else "none"
    return plan.with_(action=Action.ROLLBACK, resume=resume, overrides=overrides, quarantine=tuple(quarantine),
                      details={"resume_step": resume_step, "bad_step": step, "lr_before": lr,
                               "corrupt": corrupt})


def _num(v: Any) -> float | None:
    return finite_number(v)


def _oom(cfg: Config, job: Job, plan: RetryPlan) -> RetryPlan:
    mem = job.resources.get("mem_mb")
    if not mem:
        return RetryPlan.make(Action.GIVE_UP, why="out of memory at micro-batch 1 and no --mem to raise")
    new = min(int(mem * cfg.oom_mem_factor), cfg.oom_mem_cap_mb)
    if new <= mem:
        return RetryPlan.make(Action.GIVE_UP, why=f"out of memory at the memory cap ({mem} MB)")
    return plan.with_(action=Action.MORE_MEMORY, resources={"mem_mb": new}, details={"mem_mb_before": mem})


def _enospc(cfg: Config, run_dir: Path, plan: RetryPlan) -> RetryPlan:
    ckpts, corrupt = checkpoints_by_verification(run_dir)
    prune = corrupt + [f"{protocol.CHECKPOINTS_DIR}/{p.name}" for _s, p in ckpts[cfg.keep_last_k:]]
    return plan.with_(action=Action.PRUNE_AND_RESUME, prune=tuple(prune), empty_trash=True,
                      details={"keep_last_k": cfg.keep_last_k})


def command_for(job: Job, plan: RetryPlan | None) -> tuple[list[str], dict[str, Any]]:
    """argv and ORCH_OVERRIDES for the next attempt: the user's command as given, and what the policy
    changed (sticky overrides, plus this attempt's resume point)."""
    overrides = dict(job.overrides)
    if plan is not None and plan.resume:
        overrides["resume"] = plan.resume
    return list(job.command), overrides
