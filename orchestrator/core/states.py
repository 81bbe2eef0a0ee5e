"""The state and sub-state types of jobs and attempts: str enums stored as their exact strings.

Stdlib only: ``orch status``'s quick path and ``models`` read these without the state machine. How a row
gets into each state, and which function moves it there, is ``orchestrator.core.lifecycle`` (the edges are data
there, each naming its one taker); the comment on each member says when it is entered.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime

STOP_GRACE_S = 60.0  # SIGTERM -> SIGKILL for orch cancel (Slurm's own KillWait usually acts first)


def utcnow() -> datetime:
    """Naive UTC, as stored in the DB (SQLite has no time zones)."""
    return datetime.now(UTC).replace(tzinfo=None)


class JobState(enum.StrEnum):
    """A job's state (contract: the exact strings)."""

    PENDING = "pending"  # entered at submit, or by a requeue that created the next attempt: not yet accepted
    SUBMITTED = "submitted"  # its attempt was accepted by a backend (or Slurm requeued it in place)
    RUNNING = "running"  # a poll saw its attempt run
    DONE = "done_marker_verified"  # its marker verified (at the end, before launch, or at requeue); terminal
    RETRYABLE_FAILED = "retryable_failed"  # an attempt ended unverified and the policy says a retry can help
    FAILED = "failed"  # permanent: invalid, refused, or out of attempts (an explicit requeue may revive it)
    CANCELLED = "cancelled"  # orch cancel


class AttemptState(enum.StrEnum):
    """One attempt = one backend submission (Slurm's in-place requeues stay in it)."""

    PENDING = "pending"  # created before any backend call (submit, sweep, requeue); nobody claimed it
    LAUNCHING = "launching"  # a launcher claimed it (claimed_at, fence) and may be calling the backend
    SUBMITTED = "submitted"  # the backend accepted it (external_id), or Slurm requeued it in place
    RUNNING = "running"  # a poll saw it run
    STOPPING = "stopping"  # orch asked it to stop (stop_reason, stop_requested_at); it may still run
    SUCCEEDED = "succeeded"  # it ended and the job's marker verified
    FAILED = "failed"  # it ended without a verified marker (failure_class says why), or its launch failed
    CANCELLED = "cancelled"  # it ended after orch cancel, or was closed unlaunched (cancelled, or verified)


class StopReason(enum.StrEnum):
    """Why orch itself is stopping an attempt (``attempts.stop_reason``)."""

    CANCEL = "cancel"  # orch cancel
    HANG = "hang"  # the reconciler saw no heartbeat for policy.hang_timeout_s


class Note(enum.StrEnum):
    """Events that change no state (from == to): a note ``orch show`` prints. The value is the reason's
    prefix, as stored since before this type existed."""

    HELD = "next attempt held: "  # requeue did not launch the next attempt (a process still runs there)
