"""``orch submit``'s quick path: the same submission, on stdlib ``sqlite3``, without importing SQLAlchemy.

The goal: an ``orch submit --backend slurm`` within 250 ms on a login node; importing SQLAlchemy and
declaring the models alone took ~0.3 s of it. This path makes the same rows, in the same transactions, and
calls the same shared steps as ``submit.submit`` + ``launch.launch`` (the checks before any row, the claim
and its fence, ``launchprep.check_and_prepare``, the fence re-check right before the backend call, the
record of the id), with the same test hook sites, for a DB that ``quickdb``'s gate lets through. The
written rows are compared with the SQLAlchemy path's by ``tests/unit/test_quicksubmit.py``.

Only the path where everything goes as expected runs here. Each deviation (the claim taken by another
launcher, a refusal or a filesystem error while preparing, a cancel that came first, a failed backend call,
a claim lost before the record) is handed, at the point where it was found, to the very function of
``launch`` that handles it on the SQLAlchemy path (which then imports SQLAlchemy); the caller renders
those outcomes from the DB, as the slow path does. ``--wait`` and ``--json`` take the slow path whole.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import protocol, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import Backend, BackendError
from orchestrator.core.config import Config
from orchestrator.core.environments import environment_record
from orchestrator.core.quickdb import QuickDB, read_time, stored_time
from orchestrator.core.resumestate import keep_globs
from orchestrator.core.rundir import check_run_dir, ensure_runs_root, run_dir_for
from orchestrator.core.states import AttemptState, JobState, utcnow
from orchestrator.core.tokens import new_token
from orchestrator.decide.mtbf import mtbf_env_from
from orchestrator.decide.suspects import SUSPECT_CLASSES, excludes_nodes, exclusion_among, failures_of, suspects_from
from orchestrator.errors import AlreadyVerified, Refused
from orchestrator.ops.claimkeeper import ClaimKeeper
from orchestrator.ops.launchprep import Held, check_and_prepare, dumps, make_spec
from orchestrator.ops.liveness import live_processes
from orchestrator.protocol import FailureClass

A, J = AttemptState, JobState

# The SQL of this path. Reads are pinned to what the models' own queries compile to for SQLite
# (``mtbf.history_select``, ``suspects.failures_select``/``clears_select``), writes by comparing the rows they
# leave with the SQLAlchemy path's, column by column (tests/unit/test_quicksubmit.py).
SQL = {
    "job_state": "SELECT jobs.state \nFROM jobs \nWHERE jobs.name = ?",
    "names_taken": "SELECT name FROM jobs WHERE name = ? UNION ALL SELECT name FROM sweeps WHERE name = ?",
    "environment": "SELECT environments.id \nFROM environments \nWHERE environments.sha256 = ?",
    "new_environment": "INSERT INTO environments (sha256, vars_json) VALUES (?, ?)",
    "new_job": "INSERT INTO jobs (name, state, backend, run_dir, command_json, resources_json, outputs_json, "
               "max_attempts, overrides_json, auto_requeue, created_at, updated_at, env_id, sweep_id, task_index) "
               "VALUES (?, 'pending', ?, ?, ?, ?, ?, ?, '{}', 0, ?, ?, ?, ?, ?)",
    "new_sweep": "INSERT INTO sweeps (name, backend, throttle, params_json, created_at) VALUES (?, ?, ?, ?, ?)",
    "sweep_jobs": "SELECT jobs.task_index, jobs.id FROM jobs WHERE jobs.sweep_id = ?",
    "sweep_tasks": "SELECT jobs.task_index, jobs.id, attempts.id FROM jobs JOIN attempts ON attempts.job_id = jobs.id "
                   "WHERE jobs.sweep_id = ?",
    # launchrecord.mark_batch: the group's token on each attempt still launching
    "mark_batch": "UPDATE attempts SET batch_token=? WHERE attempts.id = ? AND attempts.state = 'launching'",
    "new_attempt": "INSERT INTO attempts (job_id, n, token, state, backend, overrides_json, counted, restarts, fence, "
                   "created_at) VALUES (?, 1, ?, 'pending', ?, '{}', 1, 0, 0, ?)",
    "event": "INSERT INTO events (job_id, attempt_id, at, from_state, to_state, reason) VALUES (?, ?, ?, ?, ?, ?)",
    # launchclaim.claim_move of a pending attempt: compare-and-set on its state and fence, the fence + 1
    "claim": "UPDATE attempts SET claimed_at=?, fence=?, state='launching' WHERE attempts.id = ? "
             "AND attempts.state = 'pending' AND attempts.fence = ?",
    "renew": "UPDATE attempts SET claimed_at=? WHERE attempts.id = ? AND attempts.state = 'launching' "
             "AND attempts.fence = ?",
    # launchclaim.check_claims of a claim still held: renewed, and its generation noted as the one that may submit
    "check_claim": "UPDATE attempts SET claimed_at=?, launched_fence=? WHERE attempts.id = ? "
                   "AND attempts.state = 'launching' AND attempts.fence = ?",
    "record": "UPDATE attempts SET state='submitted', external_id=?, submitted_at=?, overrides_json=? "
              "WHERE attempts.id = ? AND attempts.state = 'launching' AND attempts.fence = ?",
    "claim_state": "SELECT attempts.state, attempts.fence, attempts.external_id, attempts.batch_token FROM attempts "
                   "WHERE attempts.id = ?",
    "job_submitted": "UPDATE jobs SET state='submitted', updated_at=? WHERE jobs.id = ? AND jobs.state = 'pending'",
    "mtbf_history": "SELECT attempts.started_at, attempts.ended_at, attempts.failure_class, "
                    "jobs.resources_json AS resources_json \n"
                    "FROM attempts JOIN jobs ON jobs.id = attempts.job_id \n"
                    "WHERE jobs.backend = ? AND attempts.ended_at >= ?",
    "node_failures": "SELECT jobs.name, jobs.sweep_id, sweeps.name AS name_1, attempts.n, attempts.failure_class, "
                     "attempts.ended_at, attempts.nodes \nFROM attempts JOIN jobs ON attempts.job_id = jobs.id "
                     "LEFT OUTER JOIN sweeps ON jobs.sweep_id = sweeps.id \nWHERE attempts.backend = ? AND "
                     "attempts.failure_class IN (__[POSTCOMPILE_failure_class_1]) AND attempts.ended_at >= ? AND "
                     "attempts.nodes IS NOT NULL",
    "node_clears": "SELECT node_clears.node, max(node_clears.cleared_at) AS max_1 \nFROM node_clears \n"
                   "WHERE node_clears.backend = ? GROUP BY node_clears.node",
}
# The expanding IN of the classes, as SQLAlchemy renders it at execution (one parameter per class)
_CLASSES = sorted(c.value for c in SUSPECT_CLASSES)
_FAILURES_SQL = SQL["node_failures"].replace("__[POSTCOMPILE_failure_class_1]", ", ".join("?" * len(_CLASSES)))


# ------------------------------------------------------------------------------------------
# shared with submit.submit: the checks before any row exists, in order of cost
# ------------------------------------------------------------------------------------------
def preflight(cfg: Config, name: str, job_state: Any) -> Path:
    """The run dir of a new job ``name``, after the checks before any row: the runs root usable, the run dir no
    symlink and holding no verified marker (the one completion predicate, never "non-empty": seed 000), no job
    of that name (``job_state()``: its state or None), no live process of an earlier attempt in the run dir."""
    run_dir = run_dir_for(cfg, name)
    ensure_runs_root(cfg)
    check_run_dir(cfg, run_dir)
    if protocol.verify_done_marker(run_dir).verified:
        raise AlreadyVerified(f"refused: {run_dir} holds a verified done marker; job {name!r} is finished")
    existing = job_state()
    if existing is not None:
        raise Refused(f"refused: job {name!r} already exists ({getattr(existing, 'value', existing)}); "
                      f"use `orch requeue {name}` to run it again")
    live = live_processes([run_dir])[run_dir]
    if live:
        # The DB lost this job (deleted, or another ORCH_HOME on the same runs root) but its attempt
        # still runs there: a second one beside it would share the run dir.
        raise Refused(f"refused: a live attempt runs in {run_dir} ({'; '.join(live[:3])}) that this DB "
                      "does not know (was the DB deleted?); stop it first")
    return run_dir


def name_taken(name: str) -> Refused:
    return Refused(f"refused: {name!r} already exists (a job or a sweep); use `orch requeue {name}`")


# ------------------------------------------------------------------------------------------
# the quick path
# ------------------------------------------------------------------------------------------
@dataclass
class Submitted:
    """What the quick path did. ``external_id`` set: submitted, nothing else to say. Else ``launched`` (a
    ``launch.Launched``) says what the SQLAlchemy path's handler made of a deviation: render it from the DB."""

    name: str
    run_dir: Path
    external_id: str | None = None
    launched: Any = None
    moved: list[str] = field(default_factory=list)


def submit(cfg: Config, name: str, command: list[str], backend_name: str, resources: dict[str, Any],
           max_attempts: int, outputs: list[str]) -> Submitted | None:
    """Submit as ``submit.submit`` does, or None (nothing done) when the DB does not pass ``quickdb``'s gate."""
    db = QuickDB.open(cfg)
    if db is None:
        return None
    try:
        return _submit(db, cfg, name, list(command), get_backend(backend_name), dict(resources), max_attempts,
                       list(outputs))
    finally:
        db.close()


def _submit(db: QuickDB, cfg: Config, name: str, command: list[str], backend: Backend, resources: dict[str, Any],
            max_attempts: int, outputs: list[str]) -> Submitted:
    def job_state() -> str | None:
        with db.read() as c:
            row = c.execute(SQL["job_state"], (name,)).fetchone()
        return None if row is None else row[0]

    run_dir = preflight(cfg, name, job_state)
    digest, env_vars = environment_record(os.environ)
    token = new_token()
    with db.write() as c:  # the job and its first attempt, pending (submit.submit's transaction)
        if c.execute(SQL["names_taken"], (name, name)).fetchone() is not None:
            raise name_taken(name)
        testhooks.site("names_checked")
        found = c.execute(SQL["environment"], (digest,)).fetchone()
        env_id = found[0] if found else c.execute(SQL["new_environment"], (digest, dumps(env_vars))).lastrowid
        now = stored_time(utcnow())
        job_id = c.execute(SQL["new_job"], (name, backend.name, str(run_dir), dumps(command), dumps(resources),
                                            dumps(outputs), max_attempts, now, now, env_id, None, None)).lastrowid
        attempt_id = c.execute(SQL["new_attempt"], (job_id, token, backend.name, now)).lastrowid
    return _launch(db, cfg, backend, Held(name, attempt_id, 1), job_id, token, run_dir, command, outputs, resources,
                   env_vars)


def _launch(db: QuickDB, cfg: Config, backend: Backend, held: Held, job_id: int, token: str, run_dir: Path,
            command: list[str], outputs: list[str], resources: dict[str, Any], env_vars: dict[str, str]) -> Submitted:
    """``launch.launch`` of the new attempt (attempt 1, claimed under fence 1)."""
    env = {protocol.ENV_OVERRIDES: dumps(held.overrides)}
    with db.read() as c:  # ORCH_MTBF_S: --save-interval auto's M (mtbf.py)
        env.update(mtbf_env_from(lambda cutoff: history(c, backend.name, cutoff), backend.name, resources))
    spec = make_spec(cfg, job=held.name, attempt=1, token=token, run_dir=str(run_dir), argv=command, outputs=outputs,
                     env=env, resources=resources, task=None, base_env=env_vars)
    with db.write() as c:
        now = utcnow()
        claimed = c.execute(SQL["claim"], (stored_time(now), held.fence, held.attempt_id, held.fence - 1)).rowcount
        if claimed == 1:
            event(c, job_id, held.attempt_id, now, A.PENDING, A.LAUNCHING, f"claimed (fence {held.fence})")
    if claimed != 1:  # a reconcile pass claimed it first (this process was stopped between the two transactions)
        return _deviated(held, run_dir, "lost_claim")
    with ClaimKeeper(lambda claims: renew(cfg, claims)) as keeper:
        keeper.add(held.attempt_id, held.fence)
        spec = held.spec = dataclasses.replace(spec, fence=held.fence)
        try:
            moved = check_and_prepare(cfg, spec, None, outputs, backend.name, keep_globs(resources))
        except (Refused, protocol.UnsafePath, OSError) as e:
            from orchestrator.ops.launchrecord import prepare_failed

            prepare_failed(slow_db(cfg), cfg, held.name, held.attempt_id, e)
        if moved is None:  # the marker verifies after all (a racing finish)
            from orchestrator.ops.launchrecord import close_verified

            close_verified(slow_db(cfg), held.attempt_id, job_id)
            return _deviated(held, run_dir, "verified")
        held.moved = moved
        testhooks.site("before_backend_submit")
    with db.write() as c:
        still = c.execute(SQL["check_claim"], (stored_time(utcnow()), held.fence, held.attempt_id,
                                               held.fence)).rowcount == 1
    if not still:  # a cancel came first (closed unlaunched), or a re-claimer has it: decided as launch decides
        from orchestrator.ops.launchclaim import check_claim

        outcome = check_claim(slow_db(cfg), held.attempt_id, held.fence)
        if outcome is not None:
            return _deviated(held, run_dir, outcome.value)
    testhooks.site("fence_checked")
    try:
        external_id = backend.submit(_with_exclusion(db, cfg, backend, spec))
    except (BackendError, OSError) as e:
        from orchestrator.ops.launchrecord import submission_failed

        submission_failed(slow_db(cfg), cfg, [held], e)
    testhooks.site("after_backend_submit")
    return _record(db, cfg, backend, held, job_id, run_dir, external_id)


def _record(db: QuickDB, cfg: Config, backend: Backend, held: Held, job_id: int, run_dir: Path,
            external_id: str) -> Submitted:
    """``launchrecord.record_submitted`` under this launcher's fence: launching -> submitted, the job pending ->
    submitted; if the claim is no longer this launcher's, ``launchrecord.record_own`` decides (cancel, adoption)."""
    with db.write() as c:
        now = utcnow()
        ok = c.execute(SQL["record"], (external_id, stored_time(now), dumps(held.overrides), held.attempt_id,
                                       held.fence)).rowcount == 1
        if ok:
            event(c, job_id, held.attempt_id, now, A.LAUNCHING, A.SUBMITTED, f"submitted as {external_id}")
            if c.execute(SQL["job_submitted"], (stored_time(now), job_id)).rowcount == 1:
                event(c, job_id, None, now, J.PENDING, J.SUBMITTED, f"attempt 1 submitted as {external_id}")
    if ok:
        return Submitted(held.name, run_dir, external_id, moved=held.moved)
    stop_overtaken(db, backend, [(held, external_id)])
    from orchestrator.ops.launchrecord import record_own

    return Submitted(held.name, run_dir, launched=record_own(slow_db(cfg), backend, held, external_id,
                                                              cancel=False))


def stop_overtaken(db: QuickDB, backend: Backend, submitted: list[tuple[Held, str]]) -> None:
    """Stop at once each submission whose record missed because it will never be the attempt's: a cancel came
    first (the attempt ``stopping``, no id yet), or a re-claimer's launch is the attempt's (another fence, another
    id). ``launchrecord.record_in`` decides the same from the same row; deciding here spares the program of a cancelled
    job the SQLAlchemy path's ~0.25 s of imports, in which it started, and ended verified (hostile test)."""
    from orchestrator.backends.base import AttemptRef

    refs = []
    with db.read() as c:
        for h, ext in submitted:
            row = c.execute(SQL["claim_state"], (h.attempt_id,)).fetchone()
            if row is None:
                continue
            state, fence, recorded, batch = row
            if (fence == h.fence and state == A.STOPPING.value and recorded is None) or \
                    (fence != h.fence and recorded not in (None, ext)):
                refs.append(AttemptRef(ext, h.spec.token, h.spec.run_dir, h.spec.attempt,
                                       batch=batch, task=h.spec.task))
    if refs:
        backend.cancel(refs)


def _deviated(held: Held, run_dir: Path, outcome: str) -> Submitted:
    from orchestrator.ops.launch import Launched, LaunchOutcome

    return Submitted(held.name, run_dir, launched=Launched(moved=held.moved, outcome=LaunchOutcome(outcome)))


def event(c: Any, job_id: int, attempt_id: int | None, at: Any, src: Any, dst: Any, reason: str) -> None:
    c.execute(SQL["event"], (job_id, attempt_id, stored_time(at), src.value, dst.value, reason[:2000]))


def renew(cfg: Config, claims: list[tuple[int, int]]) -> set[int]:
    """``launch.renew_claims`` on the keeper thread's own connection (sqlite3 connections stay in their thread)."""
    db = QuickDB.open(cfg)
    if db is None:
        return {attempt_id for attempt_id, _ in claims}  # cannot tell now: kept, and asked again next time
    try:
        with db.write() as c:
            now = stored_time(utcnow())
            return {a for a, f in claims if c.execute(SQL["renew"], (now, a, f)).rowcount == 1}
    finally:
        db.close()


def history(c: Any, backend: str, cutoff: Any) -> list[tuple[Any, ...]]:
    return [(read_time(s), read_time(e), cls, res)
            for s, e, cls, res in c.execute(SQL["mtbf_history"], (backend, stored_time(cutoff)))]


def _with_exclusion(db: QuickDB, cfg: Config, backend: Backend, spec: Any) -> Any:
    """``suspects.with_exclusion``, its evidence read here."""
    exclude = exclusion(db, cfg, backend, spec.resources)
    return dataclasses.replace(spec, exclude_nodes=exclude) if exclude else spec


def exclusion(db: QuickDB, cfg: Config, backend: Backend, resources: Any) -> tuple[str, ...]:
    """``suspects.exclusion_for``, its evidence read here."""
    if not excludes_nodes(cfg, backend):
        return ()
    with db.read() as c:
        def failures(since: Any) -> list[Any]:
            rows = c.execute(_FAILURES_SQL, (backend.name, *_CLASSES, stored_time(since.replace(tzinfo=None))))
            return failures_of((n, sid, sw, k, FailureClass(cls), read_time(at), nodes)
                               for n, sid, sw, k, cls, at, nodes in rows)

        def clears() -> dict[str, Any]:
            from datetime import UTC

            return {node: read_time(at).replace(tzinfo=UTC)
                    for node, at in c.execute(SQL["node_clears"], (backend.name,))}

        suspects = suspects_from(cfg, failures, clears)
    return exclusion_among(suspects, backend, resources)


def slow_db(cfg: Config) -> Any:
    """The SQLAlchemy path's Database, for a deviation's handler."""
    from orchestrator.core.db import Database

    return Database(cfg)
