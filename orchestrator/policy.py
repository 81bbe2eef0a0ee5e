"""Failure class -> what the next attempt does differently, with per-class caps.

The runbook's recovery commands (seed 002), done by policy instead of by hand at 3 a.m.:
OOM -> more memory; NaN -> roll back to an earlier verified checkpoint, halve the LR, skip the
suspect batches, quarantine the later checkpoints; disk full -> prune old checkpoints, empty the
trash; preemption / time limit / node failure -> resume, not counted against --max-attempts.

Overrides reach the bundled trainer as flags appended to its command (argparse: last wins) and any
program as JSON in ORCH_OVERRIDES. ``sticky`` overrides (lr, micro-batch, memory, data offset) stay
for every later attempt; one-shot ones (an explicit resume point) apply to the next attempt only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.config import Config
from orchestrator.models import Attempt, Job, utcnow
from orchestrator.states import JobState

# Override keys and the trainer flag each becomes.
FLAGS = {"resume": "--resume", "lr": "--lr", "skip_batches": "--skip-batches",
         "micro_batch_size": "--micro-batch-size"}


@dataclass
class Decision:
    state: JobState  # retryable_failed, failed or cancelled
    action: dict[str, Any]  # recorded on the attempt: what and why, with the changed parameters
    counted: bool
    auto: bool = False  # reconcile requeues by itself
    sticky: dict[str, Any] = field(default_factory=dict)  # merged into job.overrides
    one_shot: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)  # merged into job.resources
    quarantine: list[str] = field(default_factory=list)  # run-dir paths moved to trash on requeue
    prune: list[str] = field(default_factory=list)
    retry_not_before: datetime | None = None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def decide(cfg: Config, job: Job, attempt: Attempt, cls: str, step: int | None,
           report: dict | None) -> Decision:
    """What to do after ``attempt`` of ``job`` ended with class ``cls`` (attempt is the last one)."""
    counted = cls not in cfg.uncounted
    auto = cls in cfg.auto_requeue
    if cls == "cancelled":
        return Decision(JobState.CANCELLED, {"action": "none", "why": "cancelled"}, counted=False)
    if cls == "invalid":
        return Decision(JobState.FAILED, {"action": "give_up", "why": "invalid: retrying cannot help"}, counted)
    prior = [a for a in job.attempts if a.id != attempt.id]
    if (not counted and step is not None and prior and prior[-1].failure_class == cls
            and prior[-1].failure_step == step):
        # Uncounted classes resume for free, but a time limit shorter than start-up never gets past
        # the same step: an attempt that made no progress counts (found by a 3 s --time test that
        # looped through 30 free attempts at step 0).
        counted = True
    used = sum(1 for a in prior if a.counted) + (1 if counted else 0)
    if counted and used >= job.max_attempts:
        return Decision(JobState.FAILED, {"action": "give_up", "why": f"{used} of {job.max_attempts} attempts used"},
                        counted)
    same = sum(1 for a in prior if a.failure_class == cls) + 1
    cap = cfg.caps.get(cls)
    if cap is not None and same > cap:
        return Decision(JobState.FAILED, {"action": "give_up", "why": f"{cls} {same} times (cap {cap})"}, counted)

    run_dir = Path(job.run_dir)
    d = Decision(JobState.RETRYABLE_FAILED, {"action": "resume"}, counted, auto=auto)
    if cls == "nan":
        _nan(cfg, job, run_dir, step, report, d)
    elif cls == "oom":
        _oom(cfg, job, report, d)
    elif cls == "enospc":
        _enospc(cfg, run_dir, d)
    elif cls == "crash" and not auto:
        d.action["why"] = "waits for `orch requeue`"
    if cls == "crash" and auto:
        k = sum(1 for a in prior if a.failure_class == "crash")
        d.retry_not_before = utcnow() + timedelta(seconds=cfg.crash_backoff_s * 2 ** k)
        d.action["backoff_s"] = cfg.crash_backoff_s * 2 ** k
    return d


def _nan(cfg: Config, job: Job, run_dir: Path, step: int | None, report: dict | None, d: Decision) -> None:
    """Roll back to the newest verified checkpoint at least K steps before the bad step, LR x0.5."""
    rc = protocol.read_run_config(run_dir)
    bad = step if step is not None else None
    # Sizes only: this runs inside the reconciler's write transaction, and hashing every checkpoint
    # there held the SQLite writer lock for as long as it took. The trainer re-verifies on load.
    ckpts = protocol.verified_checkpoints(run_dir, hashes=False)
    limit = (bad - cfg.nan_rollback_steps) if bad is not None else None
    good = [(s, p) for s, p in ckpts if limit is None or s <= limit]
    resume_step = good[0][0] if good else 0
    d.quarantine = [f"{protocol.CHECKPOINTS_DIR}/{p.name}" for s, p in ckpts if not good or s > resume_step]
    # The base LR (what --lr set), never the report's scheduled LR of that step: halving a warmup
    # value would compound with the schedule on resume.
    lr = _num(job.overrides.get("lr")) or _num(rc.get("lr")) or _num((report or {}).get("lr"))
    if lr is not None:
        d.sticky["lr"] = lr * cfg.nan_lr_factor
    if bad is not None:
        # Data offset is absolute (batches skipped since step 0): add the batches from the resume
        # point up to and including the bad one, so the retry never sees them again.
        prev = int(_num(job.overrides.get("skip_batches")) or _num(rc.get("skip_batches")) or 0)
        d.sticky["skip_batches"] = prev + max(1, bad - resume_step)
    d.one_shot["resume"] = str(good[0][1]) if good else "none"
    d.action = {"action": "rollback", "resume_step": resume_step, "bad_step": bad,
                "lr": d.sticky.get("lr"), "lr_before": lr, "skip_batches": d.sticky.get("skip_batches"),
                "quarantined": d.quarantine}


def _oom(cfg: Config, job: Job, report: dict | None, d: Decision) -> None:
    mem = job.resources.get("mem_mb")
    if not mem:
        d.state, d.auto = JobState.FAILED, False
        d.action = {"action": "give_up", "why": "out of memory at micro-batch 1 and no --mem to raise"}
        return
    new = min(int(mem * cfg.oom_mem_factor), cfg.oom_mem_cap_mb)
    if new <= mem:
        d.state, d.auto = JobState.FAILED, False
        d.action = {"action": "give_up", "why": f"out of memory at the memory cap ({mem} MB)"}
        return
    d.resources["mem_mb"] = new
    d.action = {"action": "more_memory", "mem_mb_before": mem, "mem_mb": new}


def _enospc(cfg: Config, run_dir: Path, d: Decision) -> None:
    ckpts = protocol.verified_checkpoints(run_dir, hashes=False)
    d.prune = [f"{protocol.CHECKPOINTS_DIR}/{p.name}" for _s, p in ckpts[cfg.keep_last_k:]]
    d.action = {"action": "prune_and_resume", "pruned": d.prune, "keep_last_k": cfg.keep_last_k,
                "empty_trash": True}


def command_for(job: Job, one_shot: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """argv and ORCH_OVERRIDES for the next attempt: the user's command + the policy's flags."""
    overrides = {**job.overrides, **one_shot}
    argv = list(job.command)
    if _is_bundled_trainer(argv):
        for key, val in overrides.items():
            if key in FLAGS:
                argv += [FLAGS[key], str(val)]
    return argv, overrides


def _is_bundled_trainer(argv: list[str]) -> bool:
    return any(a == "trainer" and i > 0 and argv[i - 1] == "-m" for i, a in enumerate(argv))


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
