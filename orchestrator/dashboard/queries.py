"""The jobs page's query: one page of jobs with their latest attempt, filtered and sorted in SQL, and the count of
each state; the shown jobs' attempts in one more query, for the cause of each end and each job's goodput (its held
time, GPU-hours and badput, as ``orch show`` splits it). Its cost grows with the page, not with the history: a page
of 50 reads 50 jobs' rows and run dirs, whatever the table holds."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from typing import Any

from sqlalchemy import Text, cast, func, select

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.goodput import Category, JobSplit
from orchestrator.core.lifecycle import JobState
from orchestrator.core.models import Attempt, Job, Sweep
from orchestrator.core.resources import partition_of
from orchestrator.core.states import utcnow
from orchestrator.views.beatcache import BeatCache
from orchestrator.views.goodputrows import ATTEMPT_KEYS, JOB_KEYS, JobRow, jobs_from_rows
from orchestrator.views.goodputview import job_split
from orchestrator.views.status import make_row

PER_PAGE = 50
MAX_PER_PAGE = 500
SORTS = {"new": (Job.id.desc(),), "old": (Job.id.asc(),), "name": (Job.name.asc(), Job.id.asc()),
         "state": (Job.state.asc(), Job.id.desc())}
STATES = tuple(s.value for s in JobState)


@dataclass(frozen=True)
class Filters:
    """What the jobs page shows, as its URL says it (every field validated before any query)."""

    state: str | None = None
    name: str | None = None  # a part of the name
    backend: str | None = None
    partition: str | None = None  # the partition the job asked for (resources' "partition")
    sweep: str | None = None
    since: timedelta | None = None  # submitted within
    sort: str = "new"
    page: int = 1
    per: int = PER_PAGE


@dataclass
class JobsPage:
    rows: list[dict[str, Any]]
    total: int  # jobs that pass the filters
    state_counts: dict[str, int] = field(default_factory=dict)  # every job, by state (the chips)


def _filtered(q: Any, f: Filters) -> Any:
    if f.state is not None:
        q = q.where(Job.state == JobState(f.state))
    if f.name:
        q = q.where(Job.name.contains(f.name, autoescape=True))
    if f.backend:
        q = q.where(Job.backend == f.backend)
    if f.partition:
        # the resources JSON as models.JSONType writes it (sorted keys, ": "), at the top level or under extras
        q = q.where(cast(Job.__table__.c.resources_json, Text).contains(json.dumps({"partition": f.partition})[1:-1],
                                                                      autoescape=True))
    if f.sweep:
        q = q.where(Job.sweep_id.in_(select(Sweep.id).where(Sweep.name == f.sweep)))
    if f.since is not None:
        q = q.where(Job.created_at >= utcnow() - f.since)
    return q


def jobs_page(db: Database, cfg: Config, f: Filters) -> JobsPage:
    """One page of ``orch status``'s rows, each with the causes of its attempts' ends, oldest first.

    The page's jobs are chosen on the jobs table alone (filtered, sorted and limited in SQL); only then are their
    attempts read, by job id. ``orch status``'s query joins every job's latest attempt through a GROUP BY over the
    whole attempts table: at 3,000 jobs a filtered page took 12x its 300-job time (bench_dashboard)."""
    q = (select(Job.id, Job.name, Job.state, Job.backend, Job.run_dir, Job.task_index, Job.resources, Job.created_at,
                Sweep.name.label("sweep"))
         .outerjoin(Sweep, Sweep.id == Job.sweep_id))
    q = _filtered(q, f).order_by(*SORTS[f.sort]).limit(f.per).offset((f.page - 1) * f.per)
    a_cols = [getattr(Attempt, k) for k in ATTEMPT_KEYS]
    with db.read() as s:
        jobs = [dict(r._mapping) for r in s.execute(q)]
        total = s.scalar(_filtered(select(func.count()).select_from(Job), f)) or 0
        by_state = s.execute(select(Job.state, func.count()).group_by(Job.state))
        counts = {getattr(st, "value", st): n for st, n in by_state}
        attempts: dict[int, list[Any]] = {j["id"]: [] for j in jobs}
        if jobs:
            for a in s.execute(select(*a_cols, Attempt.external_id, Attempt.state, Attempt.nodes)
                               .where(Attempt.job_id.in_(list(attempts))).order_by(Attempt.job_id, Attempt.n)):
                attempts[a.job_id].append(a)
    now = time.time()
    # each job's goodput from the same rows, its heartbeat files read after the transaction
    splits = {j.name: split_of(j, now) for j in jobs_from_rows(
        [tuple(j[k] for k in JOB_KEYS) for j in jobs], [tuple(a)[:len(ATTEMPT_KEYS)] for m in attempts.values()
                                                       for a in m])}
    out = []
    for j in jobs:
        mine = attempts[j["id"]]
        latest = mine[-1] if mine else None
        row = make_row({**j, "count": len(mine), "n": latest.n if latest else None,
                        "external_id": latest.external_id if latest else None,
                        "failure_class": latest.failure_class if latest else None,
                        "restarts": latest.restarts if latest else 0,
                        "attempt_state": latest.state if latest else None}, cfg)
        row["attempt_causes"] = labelled([{"n": a.n, "class": getattr(a.failure_class, "value", a.failure_class),
                                           "restarts": a.restarts or 0} for a in mine], row["state"])
        row["partition"] = f"{j['backend']}/{partition_of(j['resources']) or '-'}"
        row["nodes"] = latest.nodes if latest else None
        row["submitted"] = j["created_at"].strftime("%Y-%m-%d %H:%M") if j["created_at"] else None
        row["goodput"] = row_goodput(splits.get(j["name"]))
        # the step its last save committed (the heartbeat's saved_step: where a resume would start), and how long
        # a live job's latest attempt has run
        beat = protocol.read_progress(j["run_dir"], latest.n) if latest and row["state"] != "pending" else None
        row["saved_step"] = (beat or {}).get("saved_step")
        live = latest is not None and latest.started_at is not None and latest.ended_at is None
        row["running_s"] = max(0.0, now - latest.started_at.replace(tzinfo=UTC).timestamp()) if live else None
        out.append(row)
    return JobsPage(out, total, {st: counts.get(st, 0) for st in STATES})


def sweep_tasks(db: Database, name: str) -> tuple[list[dict[str, Any]], list[JobSplit]] | None:
    """A sweep's tasks (name, index, state, parameters' index) in task order and each one's goodput split; None when
    ``name`` is no sweep. Two queries (its jobs, then their attempts, by the sweep: an IN of 10,000 task ids passes
    SQLite's parameter limit); the splits of ended tasks from the memo."""
    with db.read() as s:
        sweep_id = s.scalar(select(Sweep.id).where(Sweep.name == name))
        if sweep_id is None:
            return None
        jobs = [dict(r._mapping) for r in s.execute(
            select(Job.id, Job.name, Job.backend, Job.run_dir, Job.resources, Job.created_at, Job.state,
                   Job.task_index, Sweep.name.label("sweep")).join(Sweep, Sweep.id == Job.sweep_id)
            .where(Job.sweep_id == sweep_id).order_by(Job.task_index, Job.id))]
        rows = s.execute(select(*[getattr(Attempt, k) for k in ATTEMPT_KEYS]).join(Job, Job.id == Attempt.job_id)
                         .where(Job.sweep_id == sweep_id).order_by(Attempt.job_id, Attempt.n)).all()
    tasks = jobs_from_rows([tuple(j[k] for k in JOB_KEYS) for j in jobs], rows)
    splits = [split_of(t) for t in tasks]
    for j, sp in zip(jobs, splits, strict=True):
        j["state"] = getattr(j["state"], "value", j["state"])
        j["goodput"] = row_goodput(sp)
        j["causes"] = labelled([{"n": a.n, "class": a.cause, "restarts": a.restarts} for a in sp.attempts], j["state"])
    return jobs, splits


# The splits of jobs whose every attempt ended, by (job, its attempts' ends): final, so a page refreshed every 15 s
# reads an ended job's heartbeat histories (up to 8 MiB an attempt) once, not on every refresh. A live job's split
# grows with the clock and its files: computed each time.
_ENDED_SPLITS: OrderedDict[tuple[Any, ...], JobSplit] = OrderedDict()
ENDED_SPLITS_KEPT = 32768  # the fleet page's week of ended jobs, a few KiB each
LIVE_BEATS = BeatCache()  # a live job's heartbeats: each refresh parses only the lines appended since the last


def split_of(job: JobRow, now: float | None = None) -> JobSplit:
    """``job_split(job)``, from the memo when every attempt of the job ended; a live job's heartbeats read from
    where the last page's read stopped."""
    now = time.time() if now is None else now
    if not job.attempts or any(a.ended_at is None for a in job.attempts):
        return job_split(job, now, LIVE_BEATS.beats)
    key = (job.name, job.run_dir, job.created_at, tuple((a.n, a.token, a.ended_at) for a in job.attempts))
    got = _ENDED_SPLITS.get(key)
    if got is None:
        got = _ENDED_SPLITS[key] = job_split(job, now)
        if len(_ENDED_SPLITS) > ENDED_SPLITS_KEPT:
            _ENDED_SPLITS.popitem(last=False)
    else:
        _ENDED_SPLITS.move_to_end(key)
    return got


def row_goodput(split: JobSplit | None) -> dict[str, Any] | None:
    """A row's goodput cells: the useful share of held time, the held time, the GPU-hours (where every attempt's GPU
    count is known) and the badput (held but not useful), in seconds; None before anything was held."""
    if split is None or not split.held_s:
        return None
    useful = split.seconds.get(Category.USEFUL, 0.0)
    gpu = split.gpu_seconds()
    return {"goodput": useful / split.held_s, "held_s": split.held_s, "badput_s": max(0.0, split.held_s - useful),
            "gpu_h": sum(gpu.values()) / 3600 if gpu else None}


def labelled(causes: list[dict[str, Any]], job_state: str) -> list[dict[str, Any]]:
    """Each attempt's chip: the class its end got; the last attempt of a live job ``running``, of a verified one
    ``ok``; ``-`` for an end without a class (cancelled before it ran, say)."""
    for i, a in enumerate(causes):
        last = i == len(causes) - 1
        a["label"] = a["class"] or ("running" if last and job_state in ("running", "submitted", "pending") else
                                    "ok" if last and job_state == "done_marker_verified" else "-")
    return causes
