"""Transactions written once, run by either executor: SQLAlchemy's (any database, ``ops.statements.SessionExecutor``)
or stdlib sqlite3's (the quick path, ``quickdb.SqliteExecutor``).

Each function here takes an :class:`Executor` inside the caller's open transaction, and runs statements of
``ops/statements.py`` by name. The two paths used to spell the same transaction twice (a SQLAlchemy update here, a
hand-written string there), and the two quick paths (``quicksubmit``, ``quicksweep``) a third and fourth time; now a
change is made once, and ``tests/unit/test_transactions.py`` runs each function on both executors against the same
rows, and against the rows the SQLAlchemy path's movers (``lifecycle.move_many``) leave.

A batched move is all or nothing: each function that moves rows returns whether every row matched its
compare-and-set (the state, the fence) and writes the events only then; on False the caller rolls its transaction
back and decides row by row (``launch``'s functions), as a row moved meanwhile by a cancel or a re-claimer needs.
Stdlib only: the quick path imports it without SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from orchestrator.core.states import AttemptState, JobState

A, J = AttemptState, JobState
REASON_MAX = 2000  # events.reason is cut here, as lifecycle's movers cut it


class Executor(Protocol):
    """Runs a statement of ``ops/statements.py`` by name, its parameters by name (a time as a naive UTC datetime)."""

    def rowcount(self, statement: str, /, **values: Any) -> int:
        """Run ``statement``; the number of rows it changed."""
        ...

    def rowcount_many(self, statement: str, rows: Sequence[dict[str, Any]], /) -> int:
        """Run ``statement`` once per row of parameters; the number of rows changed in all."""
        ...

    def inserted(self, statement: str, /, **values: Any) -> int:
        """Run an INSERT; the new row's id."""
        ...

    def rows(self, statement: str, /, **values: Any) -> list[tuple[Any, ...]]:
        """Run a SELECT; its rows."""
        ...


class Held(NamedTuple):
    """An attempt this launcher claims (or holds) under ``fence``, and its job."""

    job_id: int
    attempt_id: int
    fence: int


class Submission(NamedTuple):
    """A held attempt the backend took: its id there, the overrides it runs with, its number."""

    held: Held
    external_id: str
    overrides: dict[str, Any]
    n: int = 1


class Newborn(NamedTuple):
    """A job to create with its first attempt, both pending (``orch submit``'s one, or a sweep's task)."""

    name: str
    run_dir: str
    command: list[str]
    token: str
    task_index: int | None = None


class Births(NamedTuple):
    """What every job of one submission shares."""

    backend: str
    resources: dict[str, Any]
    outputs: list[str]
    max_attempts: int
    env_id: int
    sweep_id: int | None = None


def environment_id(ex: Executor, digest: str, env_vars: dict[str, str]) -> int:
    """The id of the environment row with ``digest`` (``core.environments.environment_record``), inserted if new:
    jobs submitted from one shell share it. The insert does nothing where another submitter's row came first."""
    found = ex.rows("environment", sha256=digest)
    if not found:
        ex.rowcount("new_environment", sha256=digest, vars_json=env_vars)
        found = ex.rows("environment", sha256=digest)
    return found[0][0]


def new_sweep(ex: Executor, name: str, backend: str, throttle: int | None, params: list[dict[str, Any]],
              now: datetime) -> int:
    """The sweep row of ``orch sweep`` (either path), in the caller's transaction, which checked the names first."""
    return ex.inserted("new_sweep", name=name, backend=backend, throttle=throttle, params_json=params, now=now)


def born_pending(ex: Executor, jobs: Sequence[Newborn], common: Births, now: datetime) -> list[tuple[int, int]]:
    """Each job and its attempt 1 created pending (``lifecycle.JOB_BIRTHS``/``ATTEMPT_BIRTHS``), as ``orch submit``
    and ``orch sweep`` create them on either path, in the caller's transaction (which checked the names first);
    (job id, attempt id) of each. A sweep's tasks go in one executemany per table and are read back by their sweep
    (a statement per task was most of a 1,000-task sweep's time)."""
    def job(b: Newborn) -> dict[str, Any]:
        return dict(name=b.name, backend=common.backend, run_dir=b.run_dir, command_json=b.command,
                    resources_json=common.resources, outputs_json=common.outputs, max_attempts=common.max_attempts,
                    now=now, env_id=common.env_id, sweep_id=common.sweep_id, task_index=b.task_index)

    def attempt(job_id: int, b: Newborn) -> dict[str, Any]:
        return dict(job_id=job_id, token=b.token, backend=common.backend, now=now)

    if common.sweep_id is None:
        out = []
        for b in jobs:
            job_id = ex.inserted("new_job", **job(b))
            out.append((job_id, ex.inserted("new_attempt", **attempt(job_id, b))))
        return out
    ex.rowcount_many("new_job", [job(b) for b in jobs])
    job_ids = dict(ex.rows("sweep_jobs", sweep_id=common.sweep_id))
    ex.rowcount_many("new_attempt", [attempt(job_ids[b.task_index], b) for b in jobs])
    ids = {i: (j, a) for i, j, a in ex.rows("sweep_tasks", sweep_id=common.sweep_id)}
    return [ids[b.task_index] for b in jobs]


def events(ex: Executor, src: Any, dst: Any, rows: Iterable[tuple[int, int | None, datetime, str]]) -> None:
    """One event row of the move ``src`` -> ``dst`` per (job id, attempt id or None, at, reason), as lifecycle
    writes them."""
    from_state, to_state = src.value, dst.value  # once: an enum's .value is a descriptor call
    ex.rowcount_many("event", [dict(job_id=j, attempt_id=a, at=at, from_state=from_state, to_state=to_state,
                                    reason=why[:REASON_MAX]) for j, a, at, why in rows])


def claim_pending(ex: Executor, claims: Sequence[Held], now: datetime) -> bool:
    """pending -> launching for each claim, its fence taken from ``fence - 1`` to ``fence`` in the same
    compare-and-set, an event each; False (write nothing more, roll back) unless every one matched: another
    launcher or a cancel came first. ``launchclaim.claim_all`` and the quick paths claim through it."""
    n = ex.rowcount_many("claim", [dict(now=now, new_fence=c.fence, attempt_id=c.attempt_id, old_fence=c.fence - 1)
                                   for c in claims])
    if n != len(claims):
        return False
    events(ex, A.PENDING, A.LAUNCHING, ((c.job_id, c.attempt_id, now, f"claimed (fence {c.fence})") for c in claims))
    return True


def renew_claims(ex: Executor, claims: Iterable[tuple[int, int]], now: datetime) -> set[int]:
    """claimed_at = ``now`` for each (attempt id, fence) whose attempt is still ``launching`` under that fence;
    the ids still held (a claim another launcher took, or a cancel ended, is not renewed)."""
    return {attempt_id for attempt_id, fence in claims
            if ex.rowcount("renew", now=now, attempt_id=attempt_id, held_fence=fence) == 1}


def check_held(ex: Executor, claims: Sequence[Held], now: datetime) -> bool:
    """Right before the backend call (``launchclaim.check_claims`` of claims still held): each claim renewed and
    its generation noted as the one that may submit; False (roll back) unless every one is still held."""
    return ex.rowcount_many("check_claim", [dict(now=now, held_fence=c.fence, attempt_id=c.attempt_id)
                                            for c in claims]) == len(claims)


def mark_batch(ex: Executor, claims: Sequence[Held], batch: str) -> bool:
    """The group's token on each attempt still launching (``launchrecord.mark_batch`` of a first launch);
    False (roll back) unless every one is."""
    return ex.rowcount_many("mark_batch", [dict(batch=batch, attempt_id=c.attempt_id) for c in claims]) == len(claims)


def record_submitted(ex: Executor, subs: Sequence[Submission], now: datetime) -> bool:
    """``launchrecord.record_group`` where every claim stands: each attempt launching -> submitted with its id
    under its launcher's fence, its job pending -> submitted, an event each; False (roll back) unless every
    row matched: a cancel or a re-claimer came first, and ``launchrecord.record_in`` decides each."""
    if ex.rowcount_many("record", [dict(ext_id=s.external_id, now=now, overrides=s.overrides,
                                        attempt_id=s.held.attempt_id, held_fence=s.held.fence) for s in subs]) \
            != len(subs):
        return False
    if ex.rowcount_many("job_submitted", [dict(now=now, job_id=s.held.job_id) for s in subs]) != len(subs):
        return False
    events(ex, A.LAUNCHING, A.SUBMITTED,
           ((s.held.job_id, s.held.attempt_id, now, f"submitted as {s.external_id}") for s in subs))
    events(ex, J.PENDING, J.SUBMITTED, ((s.held.job_id, None, now, f"attempt {s.n} submitted as {s.external_id}")
                                        for s in subs))
    return True
