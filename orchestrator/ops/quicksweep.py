"""``orch sweep``'s quick path on a scheduler that keeps the group's queue (a Slurm array): the same sweep,
without importing SQLAlchemy, every step batched.

The goal: a 1,000-task ``orch sweep`` within 2x submitit's ``map_array`` of the same tasks. The
steps are those of ``sweep.submit_sweep`` + ``launch.launch_group`` (the shared checks before anything is
written, ``sweepspec.preflight_sweep``; the sweep, its jobs and first attempts in one transaction; every claim
in one; each run dir made ready by ``launchprep.check_and_prepare`` with one flush for all; the fences checked
in one; the group's token in one; ONE ``submit_group``; every id recorded in one), each per-task decision the
same, on stdlib ``sqlite3`` behind ``quickdb``'s gate.

A batched step is a compare-and-set of every task at once: when it does not match every row (a task cancelled
or re-claimed meanwhile), its transaction is rolled back whole and ``launch``'s own function for that step
decides task by task from the DB; a per-task failure (a refusal or a filesystem error while preparing) goes to
``launch``'s handler for it. Not taken (None, nothing written): a scheduler without a group queue (the local
backend keeps its throttle under a lock), a task whose run dir already holds a verified result, a DB the gate
refuses. ``--json`` renders through the SQLAlchemy path.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from orchestrator import protocol, testhooks
from orchestrator.backends import get_backend
from orchestrator.backends.base import Backend, BackendError
from orchestrator.core import transactions
from orchestrator.core.config import Config
from orchestrator.core.environments import environment_record
from orchestrator.core.quickdb import QuickDB, SqliteExecutor, run
from orchestrator.core.resumestate import keep_globs
from orchestrator.core.rundir import run_dir_for
from orchestrator.core.states import utcnow
from orchestrator.core.tokens import new_token
from orchestrator.decide.mtbf import mtbf_env_from
from orchestrator.errors import OrchError, Refused
from orchestrator.ops.claimkeeper import ClaimKeeper
from orchestrator.ops.launchprep import (
    BatchRecords,
    Held,
    check_and_prepare,
    dumps,
    make_spec,
    new_batch_token,
    reserve_batch_ballast,
    sweep_env,
    write_batch_records,
)
from orchestrator.ops.quicksubmit import (
    Mismatch,
    exclusion,
    history,
    record,
    renew,
    slow_db,
    stop_overtaken,
)
from orchestrator.ops.sweepspec import SweepRequest, names_exist, preflight_sweep


@dataclass
class SweepSubmitted:
    """What the quick path did: ``all_submitted``, or the tasks' states are read back from the DB to be shown."""

    name: str
    tasks: int
    all_submitted: bool


def sweep(cfg: Config, req: SweepRequest) -> SweepSubmitted | None:
    """Submit as ``sweep.submit_sweep`` does, or None (nothing written) where this path does not apply."""
    backend = get_backend(req.backend)
    if not backend.capabilities.group_queue:
        return None
    db = QuickDB.open(cfg)
    if db is None:
        return None
    try:
        pre = preflight_sweep(cfg, req, backend, lambda ns: _taken(db, ns))
        if pre.verified:  # a finished task of an earlier sweep: recorded done by the SQLAlchemy path
            return None
        return _sweep(db, cfg, req, backend, pre.names, pre.commands)
    finally:
        db.close()


def _taken(db: QuickDB, names: list[str]) -> set[str]:
    with db.read() as c:
        return {name for (name,) in run(c, "any_names_taken", names=names)}


def _sweep(db: QuickDB, cfg: Config, req: SweepRequest, backend: Backend, names: list[str],
           commands: list[list[str]]) -> SweepSubmitted:
    digest, env_vars = environment_record(os.environ)
    run_dirs = [run_dir_for(cfg, n) for n in names]
    resources, outputs = dict(req.resources), list(req.outputs)
    with db.write() as c:  # the sweep, its jobs and their first attempts (submit_sweep's transaction)
        taken = {name for (name,) in run(c, "any_names_taken", names=[req.name, *names])}
        if taken:
            raise names_exist(taken)
        testhooks.site("names_checked")
        now, ex = utcnow(), SqliteExecutor(c)
        sweep_id = transactions.new_sweep(ex, req.name, backend.name, req.throttle, req.params, now)
        env_id = transactions.environment_id(ex, digest, env_vars)
        tokens = [new_token() for _ in names]
        born = transactions.born_pending(
            ex, [transactions.Newborn(n, str(d), cmd, tokens[i], i)
                                for i, (n, d, cmd) in enumerate(zip(names, run_dirs, commands, strict=True))],
            transactions.Births(backend.name, resources, outputs, req.max_attempts, env_id, sweep_id), now)
        ids = dict(enumerate(born))
    held = [Held(n, ids[i][1], 1) for i, n in enumerate(names)]
    env = {protocol.ENV_OVERRIDES: dumps({})}
    with db.read() as c:  # ORCH_MTBF_S: one partition, one history read
        env.update(mtbf_env_from(lambda cutoff: history(c, backend.name, cutoff), backend.name, req.resources))
    batch_token = new_batch_token()  # before the run dirs: each task's fence record names it (SubmitSpec.batch)
    for i, h in enumerate(held):
        h.spec = make_spec(cfg, job=h.name, attempt=1, token=tokens[i], run_dir=run_dirs[i], argv=commands[i],
                           outputs=list(req.outputs), env={**env, **sweep_env(req.name, i, req.params)},
                           resources=dict(req.resources), task=i, base_env=env_vars, batch=batch_token,
                           fence=1)  # the generation _claim_all claims every task under, or it falls back
    try:
        _claim_all(db, held, [ids[i][0] for i in range(len(names))])
    except Mismatch:  # a reconcile pass launches some of them already: launch decides task by task
        from orchestrator.ops.sweep import launch_queued

        launch_queued(slow_db(cfg), cfg, backend, sweep_id)
        return SweepSubmitted(req.name, len(names), False)
    testhooks.site("group_claimed")
    return _launch(db, cfg, req, backend, held, {h.attempt_id: ids[i][0] for i, h in enumerate(held)})


def _held(h: Held, job_of: dict[int, int]) -> transactions.Held:
    return transactions.Held(job_of[h.attempt_id], h.attempt_id, h.fence)


def _claim_all(db: QuickDB, held: list[Held], job_ids: list[int]) -> None:
    """``launchclaim.claim_all`` of pending attempts: every one claimed under fence 1, or none (``Mismatch``)."""
    with db.write() as c:
        claims = [transactions.Held(job_id, h.attempt_id, 1) for h, job_id in zip(held, job_ids, strict=True)]
        if not transactions.claim_pending(SqliteExecutor(c), claims, utcnow()):
            raise Mismatch


def _launch(db: QuickDB, cfg: Config, req: SweepRequest, backend: Backend, held: list[Held],
            job_of: dict[int, int]) -> SweepSubmitted:
    """``launch.launch_group`` from its claims on: prepare, flush, check the fences, mark, submit, record."""
    results: dict[str, Any] = {}
    ready: list[Held] = []
    with ClaimKeeper(lambda claims: renew(cfg, claims)) as keeper:
        batch = protocol.SyncBatch()
        outputs, keep = list(req.outputs), keep_globs(req.resources)
        in_batch = BatchRecords(held[0].spec.batch)  # the records of each run dir made here (launchprep)
        for h in held:
            keeper.add(h.attempt_id, h.fence)
            try:
                moved = check_and_prepare(cfg, h.spec, None, outputs, backend.name, keep, batch, in_batch)
            except (Refused, protocol.UnsafePath, OSError) as e:
                results[h.name] = _handled(lambda e=e, h=h: _slow().prepare_failed(slow_db(cfg), cfg, h.name,
                                                                                     h.attempt_id, e))
                continue
            if moved is None:  # its marker verifies after all
                _slow().close_verified(slow_db(cfg), h.attempt_id, job_of[h.attempt_id])
                results[h.name] = "verified"
                continue
            h.moved = moved
            if str(h.spec.task) in in_batch.records:
                h.spec = dataclasses.replace(h.spec, records_in_batch=True)
            ready.append(h)
        try:
            if in_batch.records:
                write_batch_records(held[0].spec.run_dir, in_batch, batch)
            testhooks.site("group_written")
            batch.commit()
        except OSError as e:
            _slow().group_write_failed(slow_db(cfg), cfg, ready, results, e)
            ready = []
        except protocol.UnsafePath as e:  # a symlinked batch dir: refused, as a symlinked attempts/ is
            batch.abort()
            for h in ready:
                results[h.name] = _handled(lambda e=e, h=h: _slow().prepare_failed(slow_db(cfg), cfg, h.name,
                                                                                     h.attempt_id, e))
            ready = []
        testhooks.site("before_backend_submit")
    ready = _check_claims(db, cfg, ready, job_of, results)
    testhooks.site("fence_checked")
    if ready:
        _submit(db, cfg, req, backend, ready, job_of, results)
    return SweepSubmitted(req.name, len(held), len(results) == 0)


def _check_claims(db: QuickDB, cfg: Config, ready: list[Held], job_of: dict[int, int],
                  results: dict[str, Any]) -> list[Held]:
    """``launchclaim.check_claims``: each claim still this launcher's, renewed and its generation noted; else
    (a cancel or a re-claimer came first) launch decides each from the DB."""
    try:
        with db.write() as c:
            if not transactions.check_held(SqliteExecutor(c), [_held(h, job_of) for h in ready], utcnow()):
                raise Mismatch
        return ready
    except Mismatch:
        lost = _slow_claims().check_claims(slow_db(cfg), [(h.attempt_id, h.fence) for h in ready])
        for h in ready:
            if lost[h.attempt_id] is not None:
                results[h.name] = lost[h.attempt_id]
        return [h for h in ready if lost[h.attempt_id] is None]


def _submit(db: QuickDB, cfg: Config, req: SweepRequest, backend: Backend, members: list[Held],
            job_of: dict[int, int], results: dict[str, Any]) -> None:
    batch_token = members[0].spec.batch or new_batch_token()
    try:
        with db.write() as c:
            if not transactions.mark_batch(SqliteExecutor(c), [_held(h, job_of) for h in members], batch_token):
                raise Mismatch
    except Mismatch:
        marked = _slow().mark_batch(slow_db(cfg), [h.attempt_id for h in members], batch_token)
        for h in members:
            if h.attempt_id not in marked:
                results[h.name] = "not marked"
        members = [h for h in members if h.attempt_id in marked]
        if not members:
            return
    try:
        exclude = exclusion(db, cfg, backend, members[0].spec.resources)
        specs = [dataclasses.replace(h.spec, exclude_nodes=exclude) for h in members] if exclude \
            else [h.spec for h in members]
        reserve_batch_ballast(specs)
        ids = backend.submit_group(specs, batch_token, req.throttle)
    except (BackendError, OSError) as e:
        err = _handled(lambda e=e: _slow().submission_failed(slow_db(cfg), cfg, members, e))
        results.update((h.name, err) for h in members)
        return
    testhooks.site("after_backend_submit")
    subs = [transactions.Submission(_held(h, job_of), ids[h.spec.token], h.overrides) for h in members]
    if not record(db, subs):  # a cancel came first, or a re-claimer: launch records each as it records one
        stop_overtaken(db, backend, [(h, ids[h.spec.token]) for h in members])
        for name, launched in _slow().record_group(slow_db(cfg), backend, members, ids, cancel=False).items():
            if launched.outcome.value != "submitted":
                results[name] = launched


def _handled(handler: Any) -> OrchError:
    """The error ``handler`` (a launch function that records the failure, then raises) raised."""
    try:
        handler()
    except OrchError as e:
        return e
    raise AssertionError("a failure handler returned")  # pragma: no cover - each one raises


def _slow() -> Any:
    """What the slow path records with (SQLAlchemy's), imported only when a task deviates from the quick path."""
    from orchestrator.ops import launchrecord

    return launchrecord


def _slow_claims() -> Any:
    from orchestrator.ops import launchclaim

    return launchclaim
