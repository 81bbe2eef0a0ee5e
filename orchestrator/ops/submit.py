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

from orchestrator import testhooks
from orchestrator.backends import get_backend
from orchestrator.core import transactions
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.environments import environment_record
from orchestrator.core.jobqueries import get_job, names_taken
from orchestrator.core.lifecycle import JobState, utcnow
from orchestrator.core.models import Job
from orchestrator.core.tokens import new_token
from orchestrator.ops.launch import Launched, launch
from orchestrator.ops.quicksubmit import name_taken, preflight
from orchestrator.ops.statements import SessionExecutor


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
    def job_state() -> JobState | None:
        with db.read() as s:
            return s.scalar(select(Job.state).where(Job.name == req.name))

    run_dir = preflight(cfg, req.name, job_state)
    with db.write() as s:
        if names_taken(s, [req.name]):
            raise name_taken(req.name)
        testhooks.site("names_checked")
        ex = SessionExecutor(s)
        transactions.born_pending(
            ex, [transactions.Newborn(req.name, str(run_dir), list(req.command), new_token())],
            transactions.Births(req.backend, dict(req.resources), list(req.outputs), req.max_attempts,
                                transactions.environment_id(ex, *environment_record(os.environ))), utcnow())
    req.launched = launch(db, cfg, req.name, get_backend(req.backend))
    with db.read() as s:
        job = get_job(s, req.name)
        job.attempts  # noqa: B018 - load while the session is open; callers render it afterwards
        return job
