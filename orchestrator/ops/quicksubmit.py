"""``orch submit``'s quick path: the same submission, on stdlib ``sqlite3``, without importing SQLAlchemy.

The goal: an ``orch submit --backend slurm`` within 250 ms on a login node; importing SQLAlchemy and
declaring the models alone took ~0.3 s of it. This path makes the same rows, in the same transactions, and
calls the same shared steps as ``submit.submit`` + ``launch.launch`` (the checks before any row, the claim
and its fence, ``launchprep.check_and_prepare``, the fence re-check right before the backend call, the
record of the id), with the same test hook sites, for a DB that ``quickdb``'s gate lets through. Its statements
are defined once from the models (``ops/statements.py``; their SQLite text generated into ``core/sqlitetext.py``);
the rows written are compared with the SQLAlchemy path's by ``tests/unit/test_quicksubmit.py``.

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
from orchestrator.core import transactions
from orchestrator.core.config import Config
from orchestrator.core.environments import environment_record
from orchestrator.core.quickdb import QuickDB, SqliteExecutor, read_time, run
from orchestrator.core.resumestate import keep_globs
from orchestrator.core.rundir import check_run_dir, ensure_runs_root, run_dir_for
from orchestrator.core.states import AttemptState, utcnow
from orchestrator.core.tokens import new_token
from orchestrator.decide.mtbf import mtbf_env_from
from orchestrator.decide.suspects import excludes_nodes, exclusion_among, failures_of, suspects_from
from orchestrator.errors import AlreadyVerified, Refused
from orchestrator.ops.claimkeeper import ClaimKeeper
from orchestrator.ops.launchprep import Held, check_and_prepare, dumps, make_spec
from orchestrator.ops.liveness import live_processes
from orchestrator.protocol import FailureClass

A = AttemptState


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
            row = run(c, "job_state", name=name).fetchone()
        return None if row is None else row[0]

    run_dir = preflight(cfg, name, job_state)
    digest, env_vars = environment_record(os.environ)
    token = new_token()
    with db.write() as c:  # the job and its first attempt, pending (submit.submit's transaction)
        if run(c, "names_taken", name=name).fetchone() is not None:
            raise name_taken(name)
        testhooks.site("names_checked")
        ex = SqliteExecutor(c)
        env_id = transactions.environment_id(ex, digest, env_vars)
        [(job_id, attempt_id)] = transactions.born_pending(
            ex, [transactions.Newborn(name, str(run_dir), command, token)],
            transactions.Births(backend.name, resources, outputs, max_attempts, env_id), utcnow())
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
    claim = transactions.Held(job_id, held.attempt_id, held.fence)
    with db.write() as c:
        claimed = transactions.claim_pending(SqliteExecutor(c), [claim], utcnow())
    if not claimed:  # a reconcile pass claimed it first (this process was stopped between the two transactions)
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
        still = transactions.check_held(SqliteExecutor(c), [claim], utcnow())
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
    return _record(db, cfg, backend, held, claim, run_dir, external_id)


def _record(db: QuickDB, cfg: Config, backend: Backend, held: Held, claim: transactions.Held, run_dir: Path,
            external_id: str) -> Submitted:
    """``launchrecord.record_submitted`` under this launcher's fence: launching -> submitted, the job pending ->
    submitted; if the claim is no longer this launcher's, ``launchrecord.record_own`` decides (cancel, adoption)."""
    if record(db, [transactions.Submission(claim, external_id, held.overrides)]):
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
            row = run(c, "claim_state", attempt_id=h.attempt_id).fetchone()
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


class Mismatch(Exception):
    """A batched compare-and-set did not match every row: its transaction is rolled back."""


def record(db: QuickDB, subs: list[transactions.Submission]) -> bool:
    """``transactions.record_submitted`` in a write transaction of its own, rolled back whole (False) unless every
    submission was recorded."""
    try:
        with db.write() as c:
            if not transactions.record_submitted(SqliteExecutor(c), subs, utcnow()):
                raise Mismatch
    except Mismatch:
        return False
    return True


def renew(cfg: Config, claims: list[tuple[int, int]]) -> set[int]:
    """``launch.renew_claims`` on the keeper thread's own connection (sqlite3 connections stay in their thread)."""
    db = QuickDB.open(cfg)
    if db is None:
        return {attempt_id for attempt_id, _ in claims}  # cannot tell now: kept, and asked again next time
    try:
        with db.write() as c:
            return transactions.renew_claims(SqliteExecutor(c), claims, utcnow())
    finally:
        db.close()


def history(c: Any, backend: str, cutoff: Any) -> list[tuple[Any, ...]]:
    return [(read_time(s), read_time(e), cls, res)
            for s, e, cls, res in run(c, "mtbf_history", backend=backend, since=cutoff)]


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
            rows = run(c, "node_failures", backend=backend.name, since=since.replace(tzinfo=None))
            return failures_of((n, sid, sw, k, FailureClass(cls), read_time(at), nodes)
                               for n, sid, sw, k, cls, at, nodes in rows)

        def clears() -> dict[str, Any]:
            from datetime import UTC

            return {node: read_time(at).replace(tzinfo=UTC)
                    for node, at in run(c, "node_clears", backend=backend.name)}

        suspects = suspects_from(cfg, failures, clears)
    return exclusion_among(suspects, backend, resources)


def slow_db(cfg: Config) -> Any:
    """The SQLAlchemy path's Database, for a deviation's handler."""
    from orchestrator.core.db import Database

    return Database(cfg)
