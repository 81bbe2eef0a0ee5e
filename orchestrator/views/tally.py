"""What one attempt adds to ``orch metrics``' counts, read from its row and its run dir. Stdlib only at import
(SQLAlchemy inside :func:`unsettled_select`): ``orch metrics``' quick path imports it.

A :class:`Tally` is final once the attempt ended (its files and its predecessor's no longer change): a reconcile pass
then adds it to the running totals (``fleet_tallies``) and marks the attempt settled (``ops/tallies.py``), and the
metrics read the files only of the attempts not settled yet. Measuring every preemption in history from its
heartbeat files took 7.3 s at 100,000 jobs (bench/bench_dashboard.py), on every pass that exports the textfile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator import protocol
from orchestrator.core.goodput import record_runs
from orchestrator.protocol import FailureClass

PREEMPTED = FailureClass.PREEMPTED.value


@dataclass(frozen=True)
class Tally:
    """One attempt's share: its own end, the preemption before its first run (its predecessor's, when that was
    preempted), each in-place restart (a Slurm requeue in place) and each rank restart inside its allocation."""

    failure_class: str | None = None  # how the attempt ended (None: it has not, or it succeeded)
    redone: tuple[int, ...] = ()  # steps computed again after each measured preemption
    unmeasured: int = 0  # preemptions whose resume step is not recorded
    classes: tuple[str, ...] = ()  # the class of each in-place restart's run (the records it set aside)
    rank: tuple[tuple[str, int | None], ...] = ()  # each rank restart: its class and the steps it computed again

    def counts(self) -> dict[str, int]:
        """The running totals' keys (``fleet_tallies.name``) this tally adds to, and by how much."""
        out = {"redone_sum": sum(self.redone), "redone_count": len(self.redone), "unmeasured": self.unmeasured}
        for cls in ((self.failure_class,) if self.failure_class else ()) + self.classes:
            out[f"failures/{cls}"] = out.get(f"failures/{cls}", 0) + 1
        for cls, again in self.rank:
            out[f"rank_restarts/{cls}"] = out.get(f"rank_restarts/{cls}", 0) + 1
            if again is not None:
                out["rank_redone_sum"] = out.get("rank_redone_sum", 0) + again
                out["rank_redone_count"] = out.get("rank_redone_count", 0) + 1
        return {k: v for k, v in out.items() if v}


def attempt_tally(run_dir: str, n: int, token: str, failure_class: Any, restarts: int, rank_restarts: int,
                  prev_class: Any, prev_step: int | None) -> Tally:
    """Attempt ``n``'s :class:`Tally` (the columns of :func:`unsettled_select`, its id left out)."""
    redone: list[int] = []
    unmeasured = 0
    if _value(prev_class) == PREEMPTED:
        done = steps_redone(run_dir, n - 1, prev_step)
        if done is None:
            unmeasured += 1
        else:
            redone.append(done)
    classes: list[str] = []
    if restarts:
        # Each earlier run of an attempt requeued in place is a failure of its class (from the records it set aside;
        # ``preempted`` without one) and, for a preemption, a measurement of the steps redone. After 8 real in-place
        # preemptions both counts were 0.
        history = protocol.restart_history(run_dir, n, token)
        classes = [h["class"] for h in history][:restarts] + [PREEMPTED] * max(0, restarts - len(history))
        again = in_place_steps_redone(run_dir, n, history, restarts)
        for k, cls in enumerate(classes):
            if cls != PREEMPTED:
                continue
            if again[k] is None:
                unmeasured += 1
            else:
                redone.append(again[k])
    rank: list[tuple[str, int | None]] = []
    if rank_restarts:
        # Read from the wrapper's record, not the DB's count: a pass that has not seen the last restart yet
        # undercounts by it until the next pass, never counts one twice.
        for r in protocol.read_rank_restarts(protocol.attempt_dir(run_dir, n), token):
            known = r["failed_step"] is not None and r["resume_step"] is not None
            rank.append((r["class"], max(0, r["failed_step"] - r["resume_step"]) if known else None))
    return Tally(_value(failure_class), tuple(redone), unmeasured, tuple(classes), tuple(rank))


def _value(v: Any) -> Any:
    return getattr(v, "value", v)


def unsettled_select(ended_only: bool = False, limit: int | None = None):  # a sqlalchemy Select
    """The attempts not settled yet: (id, then :func:`attempt_tally`'s arguments); ``ended_only``: only those that
    ended, which a reconcile pass settles. Found through ``ix_attempts_unsettled``, which holds only unsettled rows:
    the live attempts and those ended since the last pass. No ORDER BY: with one (and a LIMIT), SQLite's planner
    chose to scan every attempt in rowid order over the partial index (tests/unit/test_open_attempts_index.py)."""
    from sqlalchemy import select
    from sqlalchemy.orm import aliased

    from orchestrator.core.models import Attempt, Job, unsettled_term

    prev = aliased(Attempt)
    q = (select(Attempt.id, Job.run_dir, Attempt.n, Attempt.token, Attempt.failure_class, Attempt.restarts,
                Attempt.rank_restarts, prev.failure_class, prev.failure_step)
         .join(Job, Job.id == Attempt.job_id)
         .outerjoin(prev, (prev.job_id == Attempt.job_id) & (prev.n == Attempt.n - 1))
         .where(unsettled_term()))
    if ended_only:
        q = q.where(Attempt.ended_at.is_not(None))
    return q if limit is None else q.limit(limit)


def in_place_steps_redone(run_dir: str, n: int, history: list[dict], restarts: int) -> list[int | None]:
    """For each of attempt ``n``'s ``restarts`` in-place restarts: steps the next run computed again, or None.

    The runs are told apart in the attempt's heartbeat history (``progress.jsonl``, appended by every run):
    a new run starts where ``resumed_from`` changes or the step goes back. The step a run reached is the later
    of its last heartbeat and the step its set-aside failure report names; the next run's ``resumed_from`` is
    where it began. Unless the history splits into exactly ``restarts + 1`` runs, nothing is measured.
    """
    runs = record_runs(protocol.read_progress_history(run_dir, n))
    if len(runs) != restarts + 1:
        return [None] * restarts
    out: list[int | None] = []
    for k in range(restarts):
        reported = history[k].get("step") if k < len(history) else None
        reached = max((v for v in (reported, runs[k][-1].get("step")) if v is not None), default=None)
        resumed = runs[k + 1][0].get("resumed_from")
        out.append(None if reached is None or resumed is None else max(0, reached - resumed))
    return out


def steps_redone(run_dir: str, n: int, failure_step: int | None) -> int | None:
    """Steps attempt ``n+1`` had to compute again after attempt ``n`` was preempted, or None if unknown.

    The last step attempt ``n`` reached is the later of its failure report's step and its last
    heartbeat's (a heartbeat lags the loop by up to one interval, so this can undercount); the step
    attempt ``n+1`` resumed from is the ``resumed_from`` its heartbeats carry (the bundled trainer,
    ``orch_run`` and the Lightning and HF callbacks write it; other programs do not, and their
    preemptions count as unmeasured).
    """
    after = protocol.read_progress(run_dir, n + 1) or {}
    resumed = after.get("resumed_from")
    before = protocol.read_progress(run_dir, n) or {}
    reached = max((v for v in (failure_step, before.get("step")) if v is not None), default=None)
    if resumed is None or reached is None:
        return None
    return max(0, reached - resumed)
