"""Read-only views for status/show/logs. Imports no torch, no submitit, no Alembic."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from orchestrator import protocol
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.jobs import attempt_ref, attempt_view, get_job
from orchestrator.lifecycle import ATTEMPT_LIVE, AttemptState, JobState
from orchestrator.models import Attempt, Job, Sweep

SLOW_MIN_SAMPLES = 5


def status_rows(db: Database, cfg: Config, state: str | None = None) -> list[dict[str, Any]]:
    """One row per job with its latest attempt; one query, plus heartbeats of running jobs only."""
    latest = (select(Attempt.job_id, func.max(Attempt.n).label("n"), func.count().label("count"))
              .group_by(Attempt.job_id).subquery())
    q = (select(Job.name, Job.state, Job.backend, Job.run_dir, latest.c.count, Attempt.external_id,
                Attempt.failure_class, Attempt.n, Attempt.restarts, Sweep.name.label("sweep"), Job.task_index)
         .outerjoin(latest, latest.c.job_id == Job.id)
         .outerjoin(Attempt, (Attempt.job_id == Job.id) & (Attempt.n == latest.c.n))
         .outerjoin(Sweep, Sweep.id == Job.sweep_id)
         .order_by(Job.id))
    if state:
        q = q.where(Job.state == state)
    rows = []
    with db.read() as s:
        for r in s.execute(q):
            row = {"name": r.name, "state": r.state.value, "attempts": r.count or 0, "run_dir": r.run_dir,
                   "backend": r.backend, "external_id": r.external_id,
                   "failure_class": r.failure_class.value if r.failure_class else None,
                   "restarts": r.restarts or 0, "step": None, "flags": [], "sweep": r.sweep, "task": r.task_index}
            if r.state is JobState.RUNNING and r.n:
                _progress_flags(cfg, Path(r.run_dir), r.n, row)
            rows.append(row)
    return rows


def _progress_flags(cfg: Config, run_dir: Path, n: int, row: dict[str, Any]) -> None:
    import time

    p = protocol.read_progress(run_dir, n)
    if not p:
        return
    row["step"] = p.get("step")
    row["tokens_per_s"] = p.get("tokens_per_s")
    t = p.get("time")  # read_progress type- and range-checks every field it returns
    if t is not None and time.time() - t > cfg.hang_timeout_s:
        row["flags"].append("hang")
    tps, med = p.get("tokens_per_s_recent"), p.get("tokens_per_s_median")
    if (tps is not None and med is not None and med > 0
            and p.get("samples", SLOW_MIN_SAMPLES) >= SLOW_MIN_SAMPLES and tps < cfg.slow_factor * med):
        row["flags"].append("slow")


def show_job(db: Database, name: str) -> dict[str, Any]:
    with db.read() as s:
        job = get_job(s, name)
        d = {
            "name": job.name, "state": job.state.value, "backend": job.backend, "run_dir": job.run_dir,
            "command": job.command, "resources": job.resources, "outputs": job.outputs,
            "max_attempts": job.max_attempts, "overrides": job.overrides,
            "auto_requeue": job.auto_requeue if job.state is JobState.RETRYABLE_FAILED else None,
            "retry_not_before": job.retry_not_before.isoformat(timespec="seconds") + "Z"
            if job.retry_not_before and job.state is JobState.RETRYABLE_FAILED else None,
            "created_at": job.created_at.isoformat(timespec="seconds") + "Z",
            "attempts": [attempt_view(a) for a in job.attempts],
        }
        last = job.attempts[-1].n if job.attempts else None
    # Beyond the DB: what orch leaves alone in the run dir, and job-written records it refused.
    report = protocol.inspect_run_dir(d["run_dir"], last)
    d["foreign_checkpoint_files"] = report.foreign_checkpoint_files
    d["problems"] = report.problems
    for a in d["attempts"]:
        # A Slurm in-place requeue keeps the attempt; what stopped each earlier run was set aside in its dir.
        a["restart_history"] = protocol.restart_history(d["run_dir"], a["n"], a["token"]) if a["restarts"] else []
    if last is not None:
        prog = protocol.read_progress(d["run_dir"], last) or {}
        d["last_step"] = prog.get("step")
    return d


def log_paths(db: Database, name: str, n: int | None) -> tuple[list[Path], Callable[[], bool]]:
    """stdout.log and stderr.log of attempt ``n`` (default latest), and a 'still live?' probe."""
    from orchestrator.errors import UsageError

    with db.read() as s:
        job = get_job(s, name)
        if not job.attempts:
            raise UsageError(f"job {name!r} has no attempts")
        numbers = [a.n for a in job.attempts]
        n = n or numbers[-1]
        if n not in numbers:
            raise UsageError(f"job {name!r} has no attempt {n} (attempts: {numbers})")
        d = protocol.attempt_dir(job.run_dir, n)

    def live() -> bool:
        """Read-only: asks the backend, never runs a reconcile pass (a read command changes nothing)."""
        from orchestrator.backends import get_backend
        from orchestrator.backends.base import Phase

        with db.read() as s:
            a = s.scalar(select(Attempt).join(Job).where(Job.name == name, Attempt.n == n))
            if a is None or a.state not in ATTEMPT_LIVE | {AttemptState.PENDING}:
                return False
            if not a.external_id:
                return True
            ref, backend = attempt_ref(a, a.job), a.backend
        out = get_backend(backend).poll([ref]).get(ref.token)
        return out is None or out.phase in (Phase.PENDING, Phase.RUNNING, Phase.UNKNOWN)

    return [d / protocol.STDOUT_LOG, d / protocol.STDERR_LOG], live


def group_by_sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``orch status``'s table: one row per plain job, one per sweep (its tasks' states counted)."""
    out: list[dict[str, Any]] = []
    sweeps: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.get("sweep"):
            out.append(r)
            continue
        g = sweeps.get(r["sweep"])
        if g is None:
            g = sweeps[r["sweep"]] = {"name": r["sweep"], "state": "", "attempts": 0, "backend": r["backend"],
                                      "external_id": None, "step": None, "failure_class": None, "flags": [],
                                      "counts": {}, "tasks": 0}
            out.append(g)
        g["tasks"] += 1
        g["attempts"] += r["attempts"]
        g["counts"][r["state"]] = g["counts"].get(r["state"], 0) + 1
        g["flags"] = sorted(set(g["flags"]) | set(r["flags"]))
    for g in sweeps.values():
        g["state"] = f"sweep of {g['tasks']}: " + ", ".join(f"{n} {st}" for st, n in sorted(g["counts"].items()))
    return out


def show_sweep(db: Database, name: str) -> dict[str, Any] | None:
    """A sweep, its counts and one line per task; None when ``name`` is no sweep."""
    from orchestrator.sweep import sweep_of, sweep_summary

    sweep = sweep_of(db, name)
    if sweep is None:
        return None
    d = sweep_summary(sweep)
    d["params"] = sweep.params
    d["task_list"] = [{"name": t.name, "task": t.task_index, "state": t.state.value, "run_dir": t.run_dir}
                      for t in sweep.tasks]
    return d
