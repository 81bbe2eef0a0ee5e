"""Job states and the one table of allowed transitions.

``transition()`` in ``jobs.py`` is the only writer of ``jobs.state``; it checks this table and does
a compare-and-set, so two processes (cron reconcilers, a user's requeue) can never both move the
same job out of the same state.
"""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    PENDING = "pending"  # row exists, attempt not yet accepted by a backend
    SUBMITTED = "submitted"  # backend accepted it; not seen running yet
    RUNNING = "running"
    DONE = "done_marker_verified"  # terminal; reachable only through a verified marker
    RETRYABLE_FAILED = "retryable_failed"
    FAILED = "failed"  # permanent: invalid, or out of attempts (an explicit requeue may revive it)
    CANCELLED = "cancelled"


S = JobState

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.PENDING: frozenset({
        S.SUBMITTED,  # backend call returned an id (or the token was found after a crash)
        S.FAILED,  # backend refused the submission for good (invalid partition, ...)
        S.CANCELLED,  # orch cancel before submission
        S.DONE,  # a verified marker was found (e.g. requeue raced a finishing job)
    }),
    S.SUBMITTED: frozenset({
        S.RUNNING,  # poll saw it start
        S.DONE,  # finished between two polls and its marker verifies
        S.RETRYABLE_FAILED,  # ended without a verified marker, class is retryable
        S.FAILED,  # ended, class is permanent or attempts are used up
        S.CANCELLED,
    }),
    S.RUNNING: frozenset({
        S.SUBMITTED,  # Slurm requeued it in place: pending again under the same id and attempt
        S.DONE,
        S.RETRYABLE_FAILED,
        S.FAILED,
        S.CANCELLED,
    }),
    S.RETRYABLE_FAILED: frozenset({
        S.PENDING,  # orch requeue / auto-requeue creates the next attempt
        S.FAILED,  # out of attempts
        S.CANCELLED,
        S.DONE,  # the marker verifies after all (a late writer finished): never rerun it
    }),
    S.FAILED: frozenset({
        S.PENDING,  # explicit `orch requeue NAME` after the user fixed the cause
        S.DONE,
    }),
    S.CANCELLED: frozenset({
        S.PENDING,  # explicit `orch requeue NAME`
        S.DONE,
    }),
    S.DONE: frozenset(),  # terminal: a verified result is never rerun
}

TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
LIVE = frozenset({S.SUBMITTED, S.RUNNING})  # the backend holds a process for these
SETTLED = frozenset({S.DONE, S.FAILED, S.CANCELLED, S.RETRYABLE_FAILED})  # nothing runs


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]


class AttemptState(str, enum.Enum):
    """Life of one attempt (one backend submission; Slurm in-place requeues stay in it)."""

    PENDING = "pending"  # row written, backend call not known to have happened
    SUBMITTED = "submitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the job's marker verified
    FAILED = "failed"
    CANCELLED = "cancelled"
