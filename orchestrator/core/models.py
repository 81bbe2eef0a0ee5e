"""The job table: jobs, their attempts, an event log, and the reconciler's lease.

The schema changes only through Alembic migrations (``alembic/versions``); a test fails when these
models and the migrations differ. States and failure classes are typed enums stored as plain
strings (non-native enums: any SQL database, and the contract's exact strings in the file); JSON
payloads are TEXT, decoded by type decorators, so every reader gets a value, not a string to parse.
Who may create a row or change ``state``: only ``orchestrator.core.lifecycle`` (``create_job``, ``create_attempt``,
``move_job``, ``move_attempt``), which imports this module; this module imports only the state types.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Enum, Float, ForeignKey, Index, MetaData, String, Text, UniqueConstraint, false, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator

from orchestrator.core.retryplan import RetryPlan
from orchestrator.core.states import AttemptState, JobState, StopReason, utcnow
from orchestrator.protocol import FailureClass

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# The attempts not yet ended (``lifecycle.ATTEMPT_OPEN``; a unit test checks they are equal), as the literal SQL
# term of the partial index ``ix_attempts_open``. The reconciler's reads go through that index, which holds only
# these rows, so a pass costs the same beside 1M finished attempts as beside none, whatever statistics the
# planner has. Taught by P1: with ANALYZE's per-state averages SQLite scanned all 1M attempts for an IN of three
# live states (109 ms against 7 ms), because a plain index on ``state`` looked worse than a scan.
OPEN_ATTEMPT_STATES = (AttemptState.LAUNCHING, AttemptState.PENDING, AttemptState.RUNNING, AttemptState.STOPPING,
                       AttemptState.SUBMITTED)
OPEN_ATTEMPT_SQL = "state IN (" + ", ".join(f"'{s.value}'" for s in OPEN_ATTEMPT_STATES) + ")"

# The attempts whose preemption tallies are not settled yet (migration 0014), as the literal SQL term of the partial
# index ``ix_attempts_unsettled``: `orch metrics` reads files only for these, so they must be found without a scan.
UNSETTLED_SQL = "redone_count IS NULL"

__all__ = ["Base", "open_attempt_term", "unsettled_term", "OPEN_ATTEMPT_STATES", "Environment", "Sweep", "Job",
           "Attempt", "Event", "Lease", "FleetTally", "PassStats", "NodeClear", "utcnow"]


def _enum(cls: type, length: int) -> Enum:
    """A str enum stored as its value in a VARCHAR: no native type, no CHECK (migrations stay plain)."""
    return Enum(cls, native_enum=False, create_constraint=False, length=length,
                values_callable=lambda e: [m.value for m in e], validate_strings=True)


class PlanType(TypeDecorator):
    """A ``RetryPlan`` stored as JSON text (any SQL database)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: RetryPlan | None, dialect: Any) -> str | None:
        if value is None:
            return None
        return json.dumps(value.as_dict(), sort_keys=True, default=str)

    def process_result_value(self, value: str | None, dialect: Any) -> RetryPlan | None:
        return RetryPlan.from_dict(json.loads(value)) if value else None


class JSONType(TypeDecorator):
    """A JSON value (dict or list) stored as text."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True, default=str)

    def process_result_value(self, value: str | None, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Environment(Base):
    """The environment a job was submitted from, stored once per distinct content (sha256).

    Every attempt of a job runs with it, whoever launches the attempt: a cron reconciler's bare
    environment (PATH=/usr/bin:/bin, no CUDA_VISIBLE_DEVICES, no W&B key) used to become the
    environment of every retry and of every sweep task it started.
    """

    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    vars: Mapped[dict[str, str]] = mapped_column("vars_json", JSONType)


class Sweep(Base):
    """A set of jobs made from one command and a list of argument sets (a grid or a JSON-lines file).

    Each task is an ordinary job (its own run dir, marker, attempts and policy); the sweep row only
    groups them: one Slurm array per launch, a concurrency limit on the local backend, and one line
    in ``orch status``. Sweep and job names share one namespace.
    """

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    backend: Mapped[str] = mapped_column(String(16))
    throttle: Mapped[int | None] = mapped_column(default=None)  # at most this many tasks run at once
    params: Mapped[list[dict[str, Any]]] = mapped_column("params_json", JSONType, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    tasks: Mapped[list[Job]] = relationship(back_populates="sweep", order_by="Job.task_index")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[JobState] = mapped_column(_enum(JobState, 32), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    run_dir: Mapped[str] = mapped_column(Text)
    command: Mapped[list[str]] = mapped_column("command_json", JSONType)  # argv as the user gave it
    resources: Mapped[dict[str, Any]] = mapped_column("resources_json", JSONType, default=dict)
    outputs: Mapped[list[str]] = mapped_column("outputs_json", JSONType, default=list)
    max_attempts: Mapped[int] = mapped_column(default=3)
    # Parameters the policy carries to every later attempt (flags for the trainer, ORCH_OVERRIDES).
    overrides: Mapped[dict[str, Any]] = mapped_column("overrides_json", JSONType, default=dict)
    # Set when the job enters retryable_failed: whether the reconciler requeues it by itself, and not
    # before when (a crash backoff). The auto-requeue query filters on both in SQL.
    auto_requeue: Mapped[bool] = mapped_column(default=False, server_default=false())
    retry_not_before: Mapped[datetime | None] = mapped_column(default=None)
    # Indexed for the fleet views' windows (migration 0013): `orch report --since` shows the jobs created since a
    # cutoff, `orch status` those moved since one (an ended job's updated_at is when it got there; only a move sets it).
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"), index=True, default=None)
    env_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"), default=None)
    task_index: Mapped[int | None] = mapped_column(default=None)  # its index in the sweep (= array index)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.n", cascade="all, delete-orphan")
    sweep: Mapped[Sweep | None] = relationship(back_populates="tasks")
    environment: Mapped[Environment | None] = relationship()


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "n"),
        # The reconciler's pass reads only open attempts; this index keeps it independent of history.
        Index("ix_attempts_state_job", "state", "job_id"),
        # The WHERE only for SQLite here: a ``postgresql_where`` would import SQLAlchemy's PostgreSQL dialect into
        # every orch command (+25 ms on a login node); migration 0009 gives PostgreSQL the same partial index.
        Index("ix_attempts_open", "state", "job_id", sqlite_where=text(OPEN_ATTEMPT_SQL)),
        Index("ix_attempts_unsettled", "job_id", sqlite_where=text(UNSETTLED_SQL)),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    n: Mapped[int]
    token: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[AttemptState] = mapped_column(_enum(AttemptState, 16))
    backend: Mapped[str] = mapped_column(String(16))
    external_id: Mapped[str | None] = mapped_column(String(64), default=None)
    backend_state: Mapped[str | None] = mapped_column(String(64), default=None)  # the scheduler's word
    exit_code: Mapped[int | None] = mapped_column(default=None)
    failure_class: Mapped[FailureClass | None] = mapped_column(_enum(FailureClass, 32), default=None)
    failure_step: Mapped[int | None] = mapped_column(default=None)
    detail: Mapped[str | None] = mapped_column(Text, default=None)
    # What the policy decided after this attempt ended (orch show: "action").
    action: Mapped[RetryPlan | None] = mapped_column("action_json", PlanType, default=None)
    overrides: Mapped[dict[str, Any]] = mapped_column("overrides_json", JSONType, default=dict)  # ran with
    # What its launch must do first: the previous attempt's decision (resume point, quarantine, prune).
    plan: Mapped[RetryPlan | None] = mapped_column("plan_json", PlanType, default=None)
    counted: Mapped[bool] = mapped_column(default=True)  # counts against --max-attempts
    restarts: Mapped[int] = mapped_column(default=0)  # Slurm in-place requeues
    claimed_at: Mapped[datetime | None] = mapped_column(default=None)  # a launcher's claim (launching)
    # The fencing generation of that claim: +1 in the same compare-and-set as every (re-)claim. Only
    # the launcher holding the current one may call the backend, and only a wrapper started with it
    # runs the program (two live copies ran when a slow launcher outlived the launch grace).
    fence: Mapped[int] = mapped_column(default=0, server_default="0")
    # The generation whose launcher last passed its final check and so may have called the backend:
    # what a re-claimer that finds that submission by token restores the fence file to.
    launched_fence: Mapped[int | None] = mapped_column(default=None)
    # Set when the attempt was launched as one task of a group submission (a Slurm array): the
    # group's token, which names the array (orch-<batch_token>) and finds it again after a crash.
    batch_token: Mapped[str | None] = mapped_column(String(64), index=True, default=None)
    stop_requested_at: Mapped[datetime | None] = mapped_column(default=None)  # stopping since
    stop_reason: Mapped[StopReason | None] = mapped_column(_enum(StopReason, 16), default=None)
    # Where it ran, from the wrapper's exit record: ranks orch launched (None: the program as given)
    # and the node list (Slurm's NodeList, or the hostname).
    world_size: Mapped[int | None] = mapped_column(default=None)
    nodes: Mapped[str | None] = mapped_column(Text, default=None)
    # The hang stop's record (migration 0010), written by observe when it stops a hung attempt: the rank
    # furthest behind (None for a one-process job), the step of its last heartbeat, how long it had made no
    # progress. Typed: the rank once travelled inside the free-text detail and classify cut it back out.
    stale_rank: Mapped[int | None] = mapped_column(default=None)
    stale_step: Mapped[int | None] = mapped_column(default=None)
    stale_age_s: Mapped[float | None] = mapped_column(Float, default=None)
    # The scheduler's account of each run (migration 0011): [[start, end], ...] in epoch seconds, oldest first, end
    # null while it runs (Slurm's per-run Start and End, kept by observe). Goodput's held time: a run of an in-place
    # requeue that no pass saw was counted as queue waiting, and the queue time between two runs as held.
    runs: Mapped[list[list[float | None]] | None] = mapped_column("runs_json", JSONType, default=None)
    # Launches of the ranks this attempt replaced inside its allocation (--rank-restarts, migration 0012), from the
    # wrapper's rank_restarts.json as observe last read it: the metrics read the records of these attempts only
    # (reading every attempt's run dir grows with history, not with what restarted).
    rank_restarts: Mapped[int] = mapped_column(default=0, server_default="0")
    # Its share of the fleet's preemption measures (migration 0014), settled once after it ended by a reconcile pass
    # (``ops/tallies.py``, which adds its whole tally to ``fleet_tallies`` then): the preemption before its first run
    # (its predecessor's, if preempted) and each in-place restart's: steps computed again (sum and count of those
    # measured), preemptions not measured, and the class of each in-place restart's run. redone_count NULL: not
    # settled (``ix_attempts_unsettled``); `orch metrics` reads the run dirs of those only.
    redone_sum: Mapped[int | None] = mapped_column(default=None)
    redone_count: Mapped[int | None] = mapped_column(default=None)
    redone_unmeasured: Mapped[int | None] = mapped_column(default=None)
    restart_classes: Mapped[list[str] | None] = mapped_column("restart_classes_json", JSONType, default=None)
    submitted_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None, index=True)  # orch report's window (0013)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="attempts")


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    # Set for an attempt's move (its history); None for the job's own moves and notes (migration 0006).
    attempt_id: Mapped[int | None] = mapped_column(index=True, default=None)  # no FK: the job's cascades
    at: Mapped[datetime] = mapped_column(default=utcnow)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")


class Lease(Base):
    """A named lock with an expiry: one reconciler pass at a time, on SQLite or any SQL DB."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]


class FleetTally(Base):
    """Running totals of what the settled attempts add to ``orch metrics`` (migration 0014): failures by class, steps
    redone after preemptions, rank restarts. A reconcile pass adds an ended attempt's tally (``views/tally.py``) in the
    same transaction that marks it settled (``ops/tallies.py``), so each attempt is counted once and a crash leaves
    both or neither; the metrics add the attempts not settled yet. Reading them all from history took 7.3 s at
    100,000 jobs. Names: ``failures/<class>``, ``rank_restarts/<class>``, ``redone_sum``, ``redone_count``,
    ``unmeasured``, ``rank_redone_sum``, ``rank_redone_count``; they only grow."""

    __tablename__ = "fleet_tallies"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class PassStats(Base):
    """What the last reconciler pass measured, for ``orch metrics`` (one row per kind of pass).

    Written in the pass's lease-release transaction (no extra write transaction per pass); the
    ``*_total`` columns only grow, so they can be exposed as Prometheus counters.
    """

    __tablename__ = "pass_stats"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    finished_at: Mapped[datetime]
    duration_s: Mapped[float] = mapped_column(Float)
    polled: Mapped[int] = mapped_column(default=0)
    errors: Mapped[int] = mapped_column(default=0)
    query_failures: Mapped[int] = mapped_column(default=0)  # scheduler queries of the last pass that failed
    passes_total: Mapped[int] = mapped_column(default=0)
    query_failures_total: Mapped[int] = mapped_column(default=0)


class NodeClear(Base):
    """``orch nodes --clear NAME``: the failures on ``node`` that ended before ``cleared_at`` no longer count
    (orchestrator/decide/suspects.py; the evidence itself is the attempts table)."""

    __tablename__ = "node_clears"

    id: Mapped[int] = mapped_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    cleared_at: Mapped[datetime]


def unsettled_term() -> ColumnElement[bool]:
    """``ix_attempts_unsettled``'s own WHERE term, literal, so that SQLite uses the partial index."""
    return text("attempts." + UNSETTLED_SQL)


def open_attempt_term() -> ColumnElement[bool]:
    """``ix_attempts_open``'s own WHERE term, for a query on open attempts to AND with its narrower state test.

    SQLite uses a partial index only when the query's WHERE contains the index's term with literal values (an IN
    of bound parameters, which ``Attempt.state.in_(...)`` compiles to, does not count); PostgreSQL proves the same
    implication from either.
    """
    return text("attempts." + OPEN_ATTEMPT_SQL)
