"""The job table: jobs, their attempts, an event log, and the reconciler's lease.

The schema changes only through Alembic migrations (``alembic/versions``); a test fails when these
models and the migrations differ. JSON payloads are stored as TEXT so any SQL database works.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ForeignKey, Index, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[str] = mapped_column(String(32), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    run_dir: Mapped[str] = mapped_column(Text)
    command_json: Mapped[str] = mapped_column(Text)  # argv list as the user gave it
    resources_json: Mapped[str] = mapped_column(Text, default="{}")
    outputs_json: Mapped[str] = mapped_column(Text, default="[]")
    max_attempts: Mapped[int] = mapped_column(default=3)
    # Parameters the policy carries to the next attempt (flags for the trainer, ORCH_OVERRIDES).
    overrides_json: Mapped[str] = mapped_column(Text, default="{}")
    retry_not_before: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.n", cascade="all, delete-orphan")

    @property
    def command(self) -> list[str]:
        return json.loads(self.command_json)

    @property
    def resources(self) -> dict[str, Any]:
        return json.loads(self.resources_json or "{}")

    @property
    def outputs(self) -> list[str]:
        return json.loads(self.outputs_json or "[]")

    @property
    def overrides(self) -> dict[str, Any]:
        return json.loads(self.overrides_json or "{}")


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "n"),
        # The reconciler's pass reads only live attempts; this index keeps it independent of history.
        Index("ix_attempts_state_job", "state", "job_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    n: Mapped[int]
    token: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    backend: Mapped[str] = mapped_column(String(16))
    external_id: Mapped[str | None] = mapped_column(String(64), default=None)
    backend_state: Mapped[str | None] = mapped_column(String(64), default=None)
    exit_code: Mapped[int | None] = mapped_column(default=None)
    failure_class: Mapped[str | None] = mapped_column(String(32), default=None)
    failure_step: Mapped[int | None] = mapped_column(default=None)
    detail: Mapped[str | None] = mapped_column(Text, default=None)
    # What the policy decided after this attempt ended, with the changed parameters (orch show).
    action_json: Mapped[str | None] = mapped_column(Text, default=None)
    overrides_json: Mapped[str] = mapped_column(Text, default="{}")  # what this attempt ran with
    # What the policy asked of this attempt before it starts: one-shot flags, checkpoints to
    # quarantine or prune, whether to empty the trash (see policy.Decision).
    plan_json: Mapped[str | None] = mapped_column(Text, default=None)
    counted: Mapped[bool] = mapped_column(default=True)  # counts against --max-attempts
    restarts: Mapped[int] = mapped_column(default=0)  # Slurm in-place requeues
    submitted_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="attempts")

    @property
    def action(self) -> dict[str, Any] | None:
        return json.loads(self.action_json) if self.action_json else None

    @property
    def plan(self) -> dict[str, Any]:
        return json.loads(self.plan_json) if self.plan_json else {}


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
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
