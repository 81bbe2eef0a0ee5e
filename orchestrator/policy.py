"""Failure class -> what the next attempt does differently (a ``RetryPlan``), with per-class caps.

The runbook's recovery commands (seed 002), done by policy instead of by hand at 3 a.m.:
OOM -> more memory; NaN -> roll back to an earlier verified checkpoint, halve the LR, skip the
suspect batches, quarantine the later checkpoints; disk full -> prune old checkpoints, empty the
trash; preemption / time limit / node failure -> resume, not counted against --max-attempts.

Overrides reach every program, the bundled trainer included, as JSON in ORCH_OVERRIDES; the command
is never changed (issue 18: the bundled trainer was recognised by ``-m trainer`` in argv, so a user's
own module named ``trainer`` got ``--lr``/``--resume`` appended). ``plan.overrides`` (lr, micro-batch, data offset) and
``plan.resources`` (memory) stay for every later attempt; ``plan.resume`` applies to the next only.

Every checkpoint a plan names has had its sha256 verified here first (issue 9: a bit flip that kept
the size made a NaN rollback resume from a checkpoint the trainer then refused, and the job failed
for good). A corrupt one is quarantined, and the next older verified one is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.config import Config
from orchestrator.lifecycle import JobState, utcnow
from orchestrator.models import Attempt, Job
from orchestrator.plan import RetryPlan
from orchestrator.protocol import FailureClass, finite_number

C = FailureClass

@dataclass(frozen=True)
class Decision:
    state: JobState  # retryable_failed, failed or cancelled
    plan: RetryPlan  # recorded on the attempt (orch show: action) and carried to the next one
    counted: bool  # counts against --max-attempts


def decide(cfg: Config, job: Job, attempt: Attempt, cls: FailureClass, step: int | None,
           report: dict | None, *, never_launched: bool = False) -> Decision:
    """What to do after ``attempt`` of ``job`` ended with class ``cls`` (attempt is the last one).

    ``never_launched``: the attempt failed before it reached the backend (its program never ran).

    Hashes checkpoints (NaN, requeue plans): call it outside a DB write transaction.
    """
    cls = C(cls)
    counted = cls.value not in cfg.uncounted
    auto = cls.value in cfg.auto_requeue
    if cls is C.CANCELLED:
        return Decision(JobState.CANCELLED, RetryPlan.make("none", why="cancelled"), counted=False)
    if cls is C.INVALID:
        return Decision(JobState.FAILED, RetryPlan.make("give_up", why="invalid: retrying cannot help"), counted)
    prior = [a for a in job.attempts if a.id != attempt.id and a.n < attempt.n]
    if (not counted and step is not None and prior and prior[-1].failure_class == cls
            and prior[-1].failure_step == step):
        # Uncounted classes resume for free, but a time limit shorter than start-up never gets past
        # the same step: an attempt that made no progress counts (found by a 3 s --time test that
        # looped through 30 free attempts at step 0).
        counted = True
    # A launch onto a full disk: the program never ran, so none of its attempts was used. Counted, three
    # passes burned every attempt within seconds and a retryable failure became permanent (hostile test).
    full_at_launch = cls is C.ENOSPC and never_launched
    if full_at_launch:
        counted = False
    used = sum(1 for a in prior if a.counted) + (1 if counted else 0)
    if counted and used >= job.max_attempts:
        return Decision(JobState.FAILED, RetryPlan.make("give_up", why=f"{used} of {job.max_attempts} attempts used"),
                        counted)
    same = sum(1 for a in prior if a.failure_class == cls) + 1
    cap = cfg.caps.get(cls.value)
    if cap is not None and same > cap and not full_at_launch:
        return Decision(JobState.FAILED, RetryPlan.make("give_up", why=f"{cls} {same} times (cap {cap})"), counted)

    run_dir = Path(job.run_dir)
    plan = RetryPlan.make("resume", auto=auto)
    if cls is C.NAN:
        plan = _nan(cfg, job, run_dir, step, report, plan)
    elif cls is C.OOM:
        plan = _oom(cfg, job, plan)
        if plan.action == "give_up":
            return Decision(JobState.FAILED, plan, counted)
    elif cls is C.ENOSPC:
        plan = _enospc(cfg, run_dir, plan)
        if full_at_launch:  # retried every pass it would hammer a full disk: back off, up to an hour
            backoff = min(cfg.crash_backoff_s * 2 ** min(same - 1, 20), 3600.0)
            plan = plan.with_(not_before=utcnow() + timedelta(seconds=backoff),
                              details={**dict(plan.details), "backoff_s": backoff})
    elif cls in (C.CRASH, C.KILLED):
        if auto:  # killed: auto by default (issue 17), backed off like crash, counted, capped
            k = sum(1 for a in prior if a.failure_class == cls)
            backoff = cfg.crash_backoff_s * 2 ** k
            plan = plan.with_(not_before=utcnow() + timedelta(seconds=backoff), details={"backoff_s": backoff})
        else:
            plan = plan.with_(why="waits for `orch requeue`")
    return Decision(JobState.RETRYABLE_FAILED, plan, counted)


def verified_checkpoints(run_dir: Path) -> tuple[list[tuple[int, Path]], list[str]]:
    """(verified checkpoints newest first, run-dir paths of committed-name ones that do not verify).

    Full sha256: a same-size bit flip passes a size check (issue 9).
    """
    good, bad = [], []
    for p in protocol.iter_checkpoint_dirs(run_dir):
        if protocol.verify_checkpoint(p) is None:
            good.append((protocol.checkpoint_step(p) or 0, p))
        else:
            bad.append(f"{protocol.CHECKPOINTS_DIR}/{p.name}")
    return good, bad


def _nan(cfg: Config, job: Job, run_dir: Path, step: int | None, report: dict | None,
         plan: RetryPlan) -> RetryPlan:
    """Roll back to the newest verified checkpoint at least K steps before the bad step, LR x0.5."""
    rc = protocol.read_run_config(run_dir)
    ckpts, corrupt = verified_checkpoints(run_dir)
    limit = (step - cfg.nan_rollback_steps) if step is not None else None
    good = [(s, p) for s, p in ckpts if limit is None or s <= limit]
    resume_step = good[0][0] if good else 0
    quarantine = corrupt + [f"{protocol.CHECKPOINTS_DIR}/{p.name}" for s, p in ckpts if not good or s > resume_step]
    overrides: dict[str, Any] = {}
    # The base LR (what --lr set), never the report's scheduled LR of that step: halving a warmup
    # value would compound with the schedule on resume.
    lr = _num(job.overrides.get("lr")) or _num(rc.get("lr")) or _num((report or {}).get("lr"))
    if lr is not None:
        overrides["lr"] = lr * cfg.nan_lr_factor
    if step is not None:
        # Data offset is absolute (batches skipped since step 0): add the batches from the resume
        # point up to and including the bad one, so the retry never sees them again.
        prev = int(_num(job.overrides.get("skip_batches")) or _num(rc.get("skip_batches")) or 0)
        overrides["skip_batches"] = prev + max(1, step - resume_step)
    resume = f"{protocol.CHECKPOINTS_DIR}/{good[0][1].name}" if good else "none"
    return plan.with_(action="rollback", resume=resume, overrides=overrides, quarantine=tuple(quarantine),
                      details={"resume_step": resume_step, "bad_step": step, "lr_before": lr,
                               "corrupt": corrupt})


def _num(v: Any) -> float | None:
    return finite_number(v)


def _oom(cfg: Config, job: Job, plan: RetryPlan) -> RetryPlan:
    mem = job.resources.get("mem_mb")
    if not mem:
        return RetryPlan.make("give_up", why="out of memory at micro-batch 1 and no --mem to raise")
    new = min(int(mem * cfg.oom_mem_factor), cfg.oom_mem_cap_mb)
    if new <= mem:
        return RetryPlan.make("give_up", why=f"out of memory at the memory cap ({mem} MB)")
    return plan.with_(action="more_memory", resources={"mem_mb": new}, details={"mem_mb_before": mem})


def _enospc(cfg: Config, run_dir: Path, plan: RetryPlan) -> RetryPlan:
    ckpts, corrupt = verified_checkpoints(run_dir)
    prune = corrupt + [f"{protocol.CHECKPOINTS_DIR}/{p.name}" for _s, p in ckpts[cfg.keep_last_k:]]
    return plan.with_(action="prune_and_resume", prune=tuple(prune), empty_trash=True,
                      details={"keep_last_k": cfg.keep_last_k})


def command_for(job: Job, plan: RetryPlan | None) -> tuple[list[str], dict[str, Any]]:
    """argv and ORCH_OVERRIDES for the next attempt: the user's command as given, and what the policy
    changed (sticky overrides, plus this attempt's resume point)."""
    overrides = dict(job.overrides)
    if plan is not None and plan.resume:
        overrides["resume"] = plan.resume
    return list(job.command), overrides
