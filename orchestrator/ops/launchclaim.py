"""The launch claim: who may call the backend for an attempt, decided by compare-and-set with a fence.

A launcher claims a ``pending`` attempt (``pending -> launching``; an expired ``launching`` claim on a re-claim) in
one UPDATE that also increments ``attempts.fence``; it renews the claim while it prepares (``ClaimKeeper``), and
right before the backend call re-checks, in the DB, that the attempt is still ``launching`` under its generation
(``check_claim``): a launcher that was stopped or slowed past the grace finds its claim taken and submits nothing.
``launch.py`` says why (fencing, not timers; docs/decisions/0003-fencing-not-timers.md); sweeps claim and re-check
many attempts per transaction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core import transactions
from orchestrator.core.db import Database
from orchestrator.core.lifecycle import AttemptState, Move, claim_expired, move_attempt, move_many, utcnow
from orchestrator.core.models import Attempt, Job
from orchestrator.errors import IllegalTransition, OrchError
from orchestrator.ops.claimkeeper import ClaimKeeper, launch_grace_s
from orchestrator.ops.statements import SessionExecutor
from orchestrator.protocol import FailureClass

A = AttemptState


class LaunchOutcome(enum.StrEnum):
    """What a launch call came to."""

    SUBMITTED = "submitted"  # this launcher's backend call was accepted
    ADOPTED = "adopted"  # a re-claimer found the earlier launcher's submission by its token, and kept it
    LOST_CLAIM = "lost_claim"  # another launcher holds the attempt (or took it over): nothing submitted here
    VERIFIED = "verified"  # the marker verified before the backend call: closed unlaunched, the job done
    STOPPED = "stopped"  # orch cancel came first: closed (or stopped) unlaunched


@dataclass
class Launched:
    """What a launch did: the backend id (None when it did not reach the backend), what it trashed."""

    external_id: str | None = None
    moved: list[str] = field(default_factory=list)
    outcome: LaunchOutcome = LaunchOutcome.SUBMITTED
    detail: str = ""


def claim(db: Database, attempt_id: int, reclaim: bool) -> int | None:
    """pending -> launching (or, ``reclaim``, an expired launching claim -> a new one); the claim's
    fencing generation, taken in the same compare-and-set UPDATE, or None when another has it."""
    return claim_all(db, [attempt_id], reclaim).get(attempt_id)


def preload(s: Any, attempt_ids: list[int], jobs: bool = False) -> dict[int, Any]:
    """These attempts (and, ``jobs``, their jobs, under ``("job", id)``) read into session ``s`` by a few
    queries, not one SELECT each. Keep the dict while using them: the session's identity map
    holds rows weakly, and a dropped row is read again by ``s.get``."""
    from sqlalchemy import select

    rows: dict[Any, Any] = {}
    for i in range(0, len(attempt_ids), 500):  # below every SQLite's bound-parameter limit
        # FOR UPDATE: the rows stay as read until commit (PostgreSQL; SQLite's write lock does it already),
        # so move_many's decisions, taken on these reads, hold.
        chunk = list(s.scalars(select(Attempt).where(Attempt.id.in_(attempt_ids[i:i + 500])).with_for_update()))
        rows.update((a.id, a) for a in chunk)
        if jobs:
            for j in s.scalars(select(Job).where(Job.id.in_({a.job_id for a in chunk})).with_for_update()):
                rows["job", j.id] = j
    return rows


def claim_all(db: Database, attempt_ids: list[int], reclaim: bool) -> dict[int, int]:
    """``claim`` of many attempts in ONE write transaction (each its own compare-and-set): attempt id ->
    its new fence, for those this launcher now holds. A transaction per task was most of a sweep.

    A pending attempt is claimed by ``transactions.claim_pending`` (the quick path's claim, on this path's
    executor); an expired claim is re-claimed by ``lifecycle``'s movers (``reclaim_move``)."""
    if not attempt_ids:
        return {}
    try:
        with db.write() as s, s.no_autoflush:
            rows = preload(s, attempt_ids)
            now, fresh, moves = utcnow(), [], []
            for attempt_id in attempt_ids:
                a = rows[attempt_id]
                if a.state is A.PENDING:
                    fresh.append(transactions.Held(a.job_id, a.id, a.fence + 1))
                elif (move := reclaim_move(a, reclaim, now)) is not None:
                    moves.append(move)
            if not transactions.claim_pending(SessionExecutor(s), fresh, now):
                raise IllegalTransition("a pending attempt was claimed under us")  # rolls the batch back
            move_many(s, moves)
            return {**{h.attempt_id: h.fence for h in fresh}, **{m.row.id: m.values["fence"] for m in moves}}
    except IllegalTransition:  # a row changed under the batch (rolled back whole): one by one instead
        pass
    fences = {}
    for attempt_id in attempt_ids:
        with db.write() as s:
            a = s.get(Attempt, attempt_id)
            if a.state is A.PENDING:
                held = transactions.Held(a.job_id, a.id, a.fence + 1)
                if transactions.claim_pending(SessionExecutor(s), [held], utcnow()):
                    fences[attempt_id] = held.fence
                continue
            move = reclaim_move(a, reclaim, utcnow())
            if move is None:
                continue
            try:
                move_attempt(s, move.row, A.LAUNCHING, expect=move.expect, where=Attempt.fence == move.fence,
                             why=move.why, **move.values)
            except IllegalTransition:  # moved by another process first; move_attempt wrote nothing
                continue
            fences[attempt_id] = move.values["fence"]
    return fences


def reclaim_move(a: Attempt, reclaim: bool, now: Any) -> Move | None:
    """With ``reclaim``, the re-claim of ``a`` if its launching claim expired (a new fence), else None."""
    if not (reclaim and a.state is A.LAUNCHING and claim_expired(a.claimed_at, now, launch_grace_s())):
        return None
    fence = a.fence + 1
    return Move(a, a.state, A.LAUNCHING, {"claimed_at": now, "fence": fence}, fenced=True, fence=a.fence,
                why=f"re-claimed after the claim expired (fence {fence})")


def claim_keeper(db: Database) -> ClaimKeeper:
    return ClaimKeeper(lambda claims: renew_claims(db, claims))


def renew_claims(db: Database, claims: list[tuple[int, int]]) -> set[int]:
    """claimed_at = now for each (attempt id, fence) whose attempt is still ``launching`` under that fence,
    in one transaction; the ids still held."""
    if not claims:
        return set()
    with db.write() as s:
        return transactions.renew_claims(SessionExecutor(s), claims, utcnow())


class LostClaim(OrchError):
    """This launcher's claim was taken over (it stopped or stalled past the launch grace)."""


def check_claim(db: Database, attempt_id: int, fence: int) -> LaunchOutcome | None:
    """Right before the backend call: None while the attempt is still ``launching`` under this
    launcher's fence (the claim is renewed, and the generation noted as the one that may have called
    the backend), else the outcome: ``stopped`` (orch cancel came first: closed unlaunched) or
    ``lost_claim`` (a re-claimer has it: this launcher must not submit a second copy)."""
    return check_claims(db, [(attempt_id, fence)])[attempt_id]


def check_claims(db: Database, claims: list[tuple[int, int]]) -> dict[int, LaunchOutcome | None]:
    """``check_claim`` of many (attempt id, fence) claims in one transaction."""
    out: dict[int, LaunchOutcome | None] = {}
    if not claims:
        return out
    with db.write() as s, s.no_autoflush:
        rows = preload(s, [attempt_id for attempt_id, _ in claims])
        held = []
        for attempt_id, fence in claims:
            a = rows[attempt_id]
            if a.fence != fence:
                out[attempt_id] = LaunchOutcome.LOST_CLAIM
            elif a.state is A.STOPPING:  # a cancel that landed while this launcher prepared the run dir
                move_attempt(s, a, A.CANCELLED, where=Attempt.fence == fence, failure_class=FailureClass.CANCELLED,
                             detail="cancelled during its launch, before the backend call")
                out[attempt_id] = LaunchOutcome.STOPPED
            elif a.state is A.LAUNCHING:
                held.append(transactions.Held(a.job_id, a.id, fence))
                out[attempt_id] = None
            else:
                out[attempt_id] = LaunchOutcome.LOST_CLAIM
        # rows read in this transaction: every claim still held holds, or all of it rolls back
        if not transactions.check_held(SessionExecutor(s), held, utcnow()):
            raise IllegalTransition("a claim changed under us")
    return out
