"""Sweeps: one command over many argument sets, each task an ordinary job, launched as a group.

``orch sweep --grid lr=1e-3,1e-4 --grid seed=1,2 -- python train.py --lr {lr} --seed {seed}`` makes
a sweep row and one job per argument set (named ``<sweep>.<index>``: its own run dir, marker,
attempts and policy). ``{key}`` in the command is replaced by the task's value (``{{``/``}}`` are
literal braces); every task also gets ``ORCH_SWEEP``, ``ORCH_TASK_INDEX`` and ``ORCH_SWEEP_PARAMS``.

On Slurm the pending tasks go out as ONE ``sbatch --array=<indices>%<throttle>`` (a busy slurmctld
and site limits such as MaxSubmitJobs punish 1,000 single submissions); a failed task's next attempt
goes out with the other tasks that need one, again as one small array. On the local backend at most
``throttle`` tasks run at once; the reconciler starts the next ones as slots free up. A verified task
is never rerun: a task whose run dir already holds a verified marker is recorded done at submission,
if its last attempt ran this task's command (else the sweep is refused: the result answers another
question, e.g. the same sweep name resubmitted with other parameters after the DB was lost).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sqlalchemy import func, select

from orchestrator import filelock, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import Backend
from orchestrator.core import transactions
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.environments import environment_record
from orchestrator.core.jobqueries import names_taken
from orchestrator.core.lifecycle import ATTEMPT_LIVE, AttemptState, JobState, create_job, utcnow
from orchestrator.core.models import Attempt, Job, Sweep
from orchestrator.core.rundir import run_dir_for
from orchestrator.core.tokens import new_token
from orchestrator.errors import DatabaseProblem, OrchError
from orchestrator.filelock import LockTimeout
from orchestrator.ops.launch import Launched, launch, launch_group
from orchestrator.ops.statements import SessionExecutor
from orchestrator.ops.sweepspec import (  # noqa: F401 - re-exported: the sweep's argument work lives there
    MAX_TASKS,
    MAX_VALUE_BYTES,
    SweepRequest,
    check_argv_size,
    command_difference,
    load_params,
    names_exist,
    params_difference,
    parse_grid,
    parse_params_file,
    preflight_sweep,
    render,
    task_name,
)


# ------------------------------------------------------------------------------------------
# submission
# ------------------------------------------------------------------------------------------
def _taken(db: Database, names: list[str]) -> set[str]:
    with db.read() as s:
        return names_taken(s, names)


def submit_sweep(db: Database, cfg: Config, req: SweepRequest) -> Sweep:
    """Create the sweep and its tasks, then launch (Slurm: one array; local: up to the throttle)."""
    backend = get_backend(req.backend)
    pre = preflight_sweep(cfg, req, backend, lambda ns: _taken(db, ns))
    names, commands, verified = pre.names, pre.commands, pre.verified
    with db.write() as s:
        taken = names_taken(s, [req.name, *names])
        if taken:
            raise names_exist(taken)
        testhooks.site("names_checked")
        ex, now = SessionExecutor(s), utcnow()
        sweep_id = transactions.new_sweep(ex, req.name, req.backend, req.throttle, req.params, now)
        env_id = transactions.environment_id(ex, *environment_record(os.environ))
        tasks = list(enumerate(zip(names, commands, strict=True)))
        for i, (n, cmd) in tasks:
            if n in verified:  # never rerun: born done
                create_job(s, JobState.DONE, "its run dir's marker verified at sweep submission", name=n,
                           backend=req.backend, run_dir=str(run_dir_for(cfg, n)), command=cmd,
                           resources=dict(req.resources), outputs=list(req.outputs), max_attempts=req.max_attempts,
                           sweep_id=sweep_id, task_index=i, env_id=env_id)
        transactions.born_pending(
            ex, [transactions.Newborn(n, str(run_dir_for(cfg, n)), cmd, new_token(), i)
                 for i, (n, cmd) in tasks if n not in verified],
            transactions.Births(req.backend, dict(req.resources), list(req.outputs), req.max_attempts, env_id,
                                sweep_id), now)
    try:
        launch_queued(db, cfg, backend, sweep_id)
    except LockTimeout as e:  # another launcher (maybe stopped) holds the lock: the tasks wait, queued
        req.launch_deferred = str(e)
    with db.read() as s:
        sweep = s.get(Sweep, sweep_id)
        sweep.tasks  # noqa: B018 - loaded for the caller
        return sweep


def launch_queued(db: Database, cfg: Config, backend: Backend, sweep_id: int,
                  names: list[str] | None = None, lock_wait_s: float | None = None) -> dict[str, Launched | OrchError]:
    """Launch the sweep's tasks whose attempt is pending (or just ``names``): as one group submission with
    the throttle where the scheduler keeps the queue (a Slurm array); else as many as the throttle leaves
    room for. ``lock_wait_s``: how long to wait for the local launch lock (default: every lock's bound)."""
    pending, running, throttle = _queue(db, sweep_id, names)
    if not pending:
        return {}
    if backend.capabilities.group_queue:
        return launch_group(db, cfg, pending, backend, throttle)
    out: dict[str, Launched | OrchError] = {}
    # Count and launch under one lock: a reconcile pass and an `orch requeue` at once each found
    # the same free slot and together ran more tasks than the throttle.
    with _local_launch_lock(cfg, lock_wait_s):
        pending, running, throttle = _queue(db, sweep_id, names)  # as the previous holder left it
        if throttle is not None:
            running += _escaped(db, sweep_id, backend)
        room = len(pending) if throttle is None else max(0, throttle - running)
        testhooks.site("sweep_room_counted")
        for name in pending[:room]:
            try:
                out[name] = launch(db, cfg, name, backend)
            except DatabaseProblem:
                raise  # the DB itself: every other task would fail the same way (one warning per pass)
            except OrchError as e:
                out[name] = e
    return out


def _queue(db: Database, sweep_id: int, names: list[str] | None) -> tuple[list[str], int, int | None]:
    """(pending task names, live attempts, throttle) of a sweep."""
    with db.read() as s:
        sweep = s.get(Sweep, sweep_id)
        q = (select(Job.name).join(Attempt).where(Job.sweep_id == sweep_id, Attempt.state == AttemptState.PENDING)
             .order_by(Job.task_index))
        if names is not None:
            q = q.where(Job.name.in_(names))
        pending = list(s.scalars(q))
        running = s.scalar(select(func.count()).select_from(Attempt).join(Job).where(
            Job.sweep_id == sweep_id, Attempt.state.in_(ATTEMPT_LIVE))) or 0
        return pending, running, sweep.throttle


def _escaped(db: Database, sweep_id: int, backend: Backend) -> int:
    """Tasks with no live attempt in the DB whose run dir still holds a live process (one that cleared
    its environment and left its session, found by cwd or open file): each holds its throttle slot,
    or the throttle was exceeded beside them (hostile test). One backend query (the local backend: one
    process-table scan)."""
    with db.read() as s:
        live_jobs = select(Attempt.job_id).where(Attempt.state.in_(ATTEMPT_LIVE))
        dirs = list(s.scalars(select(Job.run_dir).where(Job.sweep_id == sweep_id, Job.id.not_in(live_jobs))))
    if not dirs:
        return 0
    found = backend.live_in_run_dirs([Path(d) for d in dirs])
    return sum(1 for live in found.values() if live)


def _local_launch_lock(cfg: Config, wait_s: float | None = None) -> contextlib.AbstractContextManager[None]:
    """One local sweep launcher at a time on this ORCH_HOME (the local backend's tasks run here)."""
    return filelock.exclusive(cfg.home / "sweep-launch.lock", OrchError, "the sweep launch lock ", timeout_s=wait_s)
