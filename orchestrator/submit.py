"""``orch submit``: checks in order of cost, then the job row and its first attempt, then the launch.

Argument checks happened in the CLI. Here, before any row exists: the runs root is usable, the run
dir is no symlink and holds no verified marker (the guard reads the one completion predicate, never
"the directory is non-empty": seed 000), and no live process of some earlier attempt runs in it.
A refusal at this point leaves nothing behind; one after the row exists ends the attempt with the
reason (``launch``), so the job is never left ``pending``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from orchestrator import protocol, testhooks
from orchestrator.backends import get_backend
from orchestrator.config import Config
from orchestrator.db import Database
from orchestrator.errors import AlreadyVerified, Refused
from orchestrator.jobs import environment_id, get_job, names_taken
from orchestrator.launch import Launched, launch
from orchestrator.lifecycle import JobState, create_attempt, create_job
from orchestrator.liveness import live_processes
from orchestrator.models import Job
from orchestrator.rundir import check_run_dir, ensure_runs_root, run_dir_for
from orchestrator.tokens import new_token


@dataclass
class SubmitRequest:
    name: str
    command: list[str]
    backend: str = "local"
    resources: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 3
    outputs: list[str] = field(default_factory=list)
    launched: Launched | None = None  # what the launch did (lost_claim: another launcher runs it)


def submit(db: Database, cfg: Config, req: SubmitRequest) -> Job:
    """Create the job and its first attempt, then launch it. Returns the job with its attempts."""
    run_dir = run_dir_for(cfg, req.name)
    ensure_runs_root(cfg)
    check_run_dir(cfg, run_dir)
    if protocol.verify_done_marker(run_dir).verified:
        raise AlreadyVerified(f"refused: {run_dir} holds a verified done marker; job {req.name!r} is finished")
    with db.read() as s:
        existing = s.scalar(select(Job.state).where(Job.name == req.name))
    if existing is not None:
        raise Refused(f"refused: job {req.name!r} already exists ({existing.value}); "
                      f"use `orch requeue {req.name}` to run it again")
    live = live_processes([run_dir])[run_dir]
    if live:
        # The DB lost this job (deleted, or another ORCH_HOME on the same runs root) but its attempt
        # still runs there: a second one beside it would share the run dir (issue 9).
        raise Refused(f"refused: a live attempt runs in {run_dir} ({'; '.join(live[:3])}) that this DB "
                      "does not know (was the DB deleted?); stop it first")
    with db.write() as s:
        if names_taken(s, [req.name]):
            raise Refused(f"refused: {req.name!r} already exists (a job or a sweep); use `orch requeue {req.name}`")
        testhooks.site("names_checked")
        job = create_job(s, JobState.PENDING, name=req.name, backend=req.backend, run_dir=str(run_dir),
                         command=list(req.command), resources=dict(req.resources), outputs=list(req.outputs),
                         max_attempts=req.max_attempts, env_id=environment_id(s, os.environ))
        create_attempt(s, job, 1, new_token())
    req.launched = launch(db, cfg, job.name, get_backend(req.backend))
    with db.read() as s:
        job = get_job(s, req.name)
        job.attempts  # noqa: B018 - load while the session is open; callers render it afterwards
        return job
