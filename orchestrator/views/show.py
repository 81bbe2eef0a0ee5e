"""Read-only views for status/show/logs. Imports no torch, no submitit, no Alembic."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import attempt_ref, attempt_view, get_job
from orchestrator.core.lifecycle import ATTEMPT_LIVE, AttemptState, JobState, held_reason
from orchestrator.core.models import Attempt, Event, Job, Sweep
from orchestrator.core.resumestate import launch_record
from orchestrator.views.goodputview import show_goodput
from orchestrator.views.status import count_select, group_by_sweep, make_row, status_select

__all__ = ["status_rows", "group_by_sweep", "show_job", "show_sweep", "log_paths"]


def status_rows(db: Database, cfg: Config, state: str | None = None,
                cutoff: datetime | None = None) -> tuple[list[dict[str, Any]], int]:
    """(one row per job with its latest attempt, how many jobs there are in ``state``); ``cutoff``: only the live
    jobs and those that moved since then (``status_select``'s window). One query, plus heartbeats of the rows.

    Any database, through SQLAlchemy; ``orch status`` on SQLite usually takes
    ``status.quick_status_rows`` instead (same query, same rows, no SQLAlchemy import).
    """
    with db.read() as s:
        params = {"cutoff": cutoff} if cutoff is not None else {}
        found = [r._mapping for r in s.execute(status_select(state, windowed=cutoff is not None), params)]
        total = s.scalar(count_select(state))
    return [make_row(r, cfg) for r in found], total


def show_job(db: Database, name: str, events: bool = False) -> dict[str, Any]:
    """The job, its attempts and what the run dir holds; ``events``: also its history (``history``)."""
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
            "held": _held(s, job),
            "goodput": show_goodput(job),  # where its held time went (orchestrator/core/goodput.py)
        }
        if events:
            d["events"] = history(s, job)
        last = job.attempts[-1].n if job.attempts else None
    # Beyond the DB: what orch leaves alone in the run dir, and job-written records it refused.
    report = protocol.inspect_run_dir(d["run_dir"], last)
    d["foreign_checkpoint_files"] = report.foreign_checkpoint_files
    d["problems"] = report.problems
    resumed_from: dict[int, Any] = {}  # each attempt's, from the same read of its progress.json
    for a in d["attempts"]:
        # A Slurm in-place requeue keeps the attempt; what stopped each earlier run was set aside in its dir.
        a["restart_history"] = protocol.restart_history(d["run_dir"], a["n"], a["token"]) if a["restarts"] else []
        # The ranks orch launched, restarted inside the allocation after a transient failure (--rank-restarts).
        a["rank_restarts"] = protocol.read_rank_restarts(protocol.attempt_dir(d["run_dir"], a["n"]), a["token"]) \
            if (d["resources"] or {}).get("nproc_per_node") else []
        # What this attempt's launch moved to the trash and set aside as torn, and why (a
        # requeue trashed HF's checkpoints and show said nothing).
        a.update(launch_record(d["run_dir"], a["n"]))
        # The step its last heartbeat posted: where a succeeded attempt ended (`orch show` printed
        # step=- for each, failure_step being a failed attempt's only).
        progress = protocol.read_progress(d["run_dir"], a["n"]) or {}
        a["last_step"] = progress.get("step")
        resumed_from[a["n"]] = progress.get("resumed_from")
        if a["state"] in _LIVE and a["world_size"] is None and a["nodes"] is None:
            a.update(_where_it_runs(d["run_dir"], a["n"], a["token"]))
    if last is not None:
        d["last_step"] = d["attempts"][-1]["last_step"]  # read once, above
    _note_steps_trained_again(d["attempts"], resumed_from)
    d["preemptions"] = _preemptions(d["attempts"])
    d["trackers"] = _trackers(d["run_dir"])
    return d


def _note_steps_trained_again(attempts: list[dict[str, Any]], resumed_from: dict[int, Any]) -> None:
    """``trained_again`` [first, last] on each attempt that resumed before the step its predecessor had reached (a
    kill -9 after the last checkpoint), from the heartbeats: a tracker that keeps a step's first value (W&B) shows the
    predecessor's values for these steps. ``last`` is a lower bound: a heartbeat may lag a step behind."""
    for prev, a in zip(attempts, attempts[1:], strict=False):
        resumed = resumed_from.get(a["n"])
        reached = prev.get("last_step")
        if isinstance(resumed, int) and isinstance(reached, int) and reached > resumed:
            a["trained_again"] = [resumed + 1, reached]


def _trackers(run_dir: str) -> dict[str, Any]:
    """The tracker runs every attempt continues (``trackers.json``: MLflow's, mlflowrun.py; W&B's, wandbrecord.py):
    a job-written file, so only ids, names and a URI of the right type, each bounded."""
    from orchestrator.jobside.mlflowrun import read_record

    out: dict[str, Any] = {}
    rec = read_record(Path(run_dir))
    if rec is not None:
        out["mlflow"] = {"run_id": rec["run_id"][:64], "tracking_uri": rec["tracking_uri"][:1024],
                         **({"end": rec["end"]} if isinstance(rec.get("end"), str) else {})}
    wandb = protocol.wandb_record(run_dir)
    if wandb is not None:
        out["wandb"] = {k: wandb[k] for k in ("run_id", "project", "entity", "mode", "end") if k in wandb}
    return out


def history(s: Any, job: Job) -> list[dict[str, Any]]:
    """Every event of the job, oldest first: its own moves and notes (``attempt`` None) and each attempt's
    moves (``attempt``: its number; events before migration 0006 have none for attempts)."""
    return _events(s, {job.id: None}, {a.id: a.n for a in job.attempts})


def _events(s: Any, tasks: dict[int, str | None], numbers: dict[int, int]) -> list[dict[str, Any]]:
    """The events of the jobs ``tasks`` names (job id -> its task name in a sweep, or None), oldest first;
    ``numbers``: attempt id -> its number."""
    rows = s.scalars(select(Event).where(Event.job_id.in_(tasks)).order_by(Event.id))
    return [{"at": e.at.isoformat(timespec="seconds") + "Z", **({"task": tasks[e.job_id]} if tasks[e.job_id] else {}),
             "attempt": numbers.get(e.attempt_id), "from": e.from_state, "to": e.to_state, "reason": e.reason}
            for e in rows]


_LIVE = {s.value for s in ATTEMPT_LIVE}


def _where_it_runs(run_dir: str, n: int, token: str) -> dict[str, Any]:
    """world_size and nodes of a live attempt, from its wrapper's record (the DB has them once it ends): a job-
    written file, so only this token's record, and only values of the right type."""
    try:
        w = protocol.read_json_bounded(protocol.attempt_dir(run_dir, n) / protocol.WRAPPER_FILE, limit=1 << 16)
    except (OSError, ValueError):
        return {}
    if not isinstance(w, dict) or w.get("token") != token:
        return {}
    size, nodes = w.get("world_size"), w.get("nodes")
    return {"world_size": size if protocol.is_int(size, 1, 10**7) else None,
            "nodes": nodes[:500] if isinstance(nodes, str) else None}


def _preemptions(attempts: list[dict[str, Any]]) -> dict[str, int]:
    """Preemptions of the job: attempts that ended ``preempted`` plus in-place restarts by the scheduler whose
    run was preempted (a Slurm requeue in place was counted nowhere). A restart without a record of
    why counts as a preemption: Slurm requeues in place on preemption (or a node failure)."""
    requeued = sum(1 for a in attempts if a["failure_class"] == "preempted")
    in_place = sum(protocol.in_place_preemptions(a.get("restart_history") or [], a["restarts"]) for a in attempts)
    return {"total": requeued + in_place, "in_place": in_place}


def _held(s: Any, job: Job) -> str | None:
    """Why the job's next attempt was not launched (requeue's latest note), while it still waits."""
    if job.state not in (JobState.RETRYABLE_FAILED, JobState.FAILED, JobState.CANCELLED):
        return None
    ev = s.scalar(select(Event).where(Event.job_id == job.id, Event.attempt_id.is_(None))
                  .order_by(Event.id.desc()).limit(1))
    return held_reason(ev)


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


def show_sweep(db: Database, name: str, events: bool = False) -> dict[str, Any] | None:
    """A sweep, its counts and one line per task; None when ``name`` is no sweep. ``events``: every task's
    history, oldest first, each event naming its task (``orch show SWEEP --events`` printed none)."""
    sweep = sweep_of(db, name)
    if sweep is None:
        return None
    d = sweep_summary(sweep)
    d["params"] = sweep.params
    d["task_list"] = [{"name": t.name, "task": t.task_index, "state": t.state.value, "run_dir": t.run_dir}
                      for t in sweep.tasks]
    if events:
        d["events"] = _tasks_history(db, {t.id: t.name for t in sweep.tasks})
    return d


def _tasks_history(db: Database, names: dict[int, str]) -> list[dict[str, Any]]:
    """``history`` for many jobs at once (a sweep's tasks): one query for the events, one for attempt numbers."""
    if not names:
        return []
    with db.read() as s:
        return _events(s, names, dict(s.execute(select(Attempt.id, Attempt.n).where(Attempt.job_id.in_(names))).all()))


def sweep_of(db: Database, name: str) -> Sweep | None:
    with db.read() as s:
        sweep = s.scalar(select(Sweep).where(Sweep.name == name))
        if sweep is not None:
            sweep.tasks  # noqa: B018
        return sweep


def sweep_summary(sweep: Sweep) -> dict[str, Any]:
    """Counts per state and the tasks (``orch status`` groups by this, ``orch show SWEEP`` prints it)."""
    counts: dict[str, int] = {}
    for t in sweep.tasks:
        counts[t.state.value] = counts.get(t.state.value, 0) + 1
    return {"name": sweep.name, "kind": "sweep", "backend": sweep.backend, "throttle": sweep.throttle,
            "tasks": len(sweep.tasks), "states": dict(sorted(counts.items())),
            "created_at": sweep.created_at.isoformat(timespec="seconds") + "Z"}
