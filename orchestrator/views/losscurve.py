"""The loss curve of a job across all its attempts, and the points where an attempt ended or began.

Data only (stdlib + DB): ``orch plot --json`` prints it, ``orchestrator.views.plot`` draws it. The curve
comes from each attempt's heartbeat history (``attempts/<n>/progress.jsonl``, read through the
protocol's checked reader); why an attempt ended comes from the DB (its failure class, which orch
derived from the job's failure report, the wrapper's exit record and the scheduler).

Marks, each ``{"kind", "attempt", "step", "loss", ...}``:

* ``preemption``: an attempt ended preempted (its last saved step);
* ``rollback``: an attempt hit NaN (the bad step; ``to_step`` is where the policy rolled back to);
* ``failure``: any other end without a verified marker (``class`` says which);
* ``resume``: an attempt began from an earlier one's checkpoint (``in_place``: the scheduler requeued
  the same attempt, seen as its step going back or its ``resumed_from`` changing, ``goodput.starts_a_run``).
"""

from __future__ import annotations

from typing import Any

from orchestrator import protocol
from orchestrator.core.db import Database
from orchestrator.core.goodput import record_runs
from orchestrator.core.jobqueries import get_job
from orchestrator.protocol import FailureClass
from orchestrator.views.progressbounds import plausible

MARK_KINDS = ("resume", "rollback", "preemption", "failure")
Point = tuple[int, float]


def loss_curve(db: Database, name: str) -> dict[str, Any]:
    """``{"name", "state", "series": [{"attempt", "points": [[step, loss], ...]}], "marks": [...]}``.

    A login-node read: no torch, no reconcile pass, nothing written. Raises JobNotFound.
    """
    with db.read() as s:
        job = get_job(s, name)
        run_dir, state = job.run_dir, job.state.value
        attempts = [(a.n, a.failure_class, a.failure_step, a.action) for a in job.attempts]
    series: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []
    earlier: list[Point] = []  # every point of the attempts before, in order
    prev_action = None
    for n, cls, failure_step, action in attempts:
        # plausible(): a job's loss of 1e308 made the plot's axis 2e308 wide (LinAlgError, exit 1)
        records = [r for r in map(plausible, protocol.read_progress_history(run_dir, n)) if "step" in r]
        runs = record_runs(records)
        if n > 1 and (prev_action is not None or runs):
            step = _resume_step(prev_action, runs)
            if step is not None:
                loss = _loss_at(earlier, step)
                marks.append(_mark("resume", n, step, loss if loss is not None else _first_loss(runs)))
        mine: list[Point] = []
        for k, run in enumerate(runs):
            pts = _points(run)
            if k > 0:  # the same attempt started again from a checkpoint (a Slurm in-place requeue)
                marks.append(_mark("resume", n, run[0]["step"], _loss_at(earlier + mine, run[0]["step"]),
                                   in_place=True))
            if pts:
                series.append({"attempt": n, "points": [list(p) for p in pts]})
            mine += pts
        if cls is not None and cls is not FailureClass.CANCELLED:
            step = failure_step if failure_step is not None else (records[-1]["step"] if records else None)
            if step is not None:
                marks.append(_end_mark(n, FailureClass(cls), step, _loss_at(mine, step), action))
        earlier += mine
        prev_action = action
    return {"name": name, "state": state, "run_dir": run_dir, "series": series, "marks": marks}


def _points(run: list[dict]) -> list[Point]:
    """(step, loss) of each heartbeat that has a loss; one per step (a heartbeat repeats its step
    when it reports a checkpoint save)."""
    pts: list[Point] = []
    for r in run:
        if "loss" not in r:
            continue
        if pts and pts[-1][0] == r["step"]:
            pts[-1] = (r["step"], r["loss"])
        else:
            pts.append((r["step"], r["loss"]))
    return pts


def _resume_step(prev_action: Any, runs: list[list[dict]]) -> int | None:
    """Where an attempt began: the rollback's target when the policy chose one (exact), else the
    attempt's first heartbeat (the bundled trainer writes one at its resume step before step 1)."""
    details = prev_action.details_dict if prev_action is not None else {}
    if protocol.is_int(details.get("resume_step"), 0):
        return details["resume_step"]
    return runs[0][0]["step"] if runs else None


def _end_mark(n: int, cls: FailureClass, step: int, loss: float | None, action: Any) -> dict[str, Any]:
    if cls is FailureClass.NAN:
        details = action.details_dict if action is not None else {}
        to = details.get("resume_step")
        return _mark("rollback", n, step, loss, **{"class": cls.value}, to_step=to if protocol.is_int(to, 0) else None)
    kind = "preemption" if cls is FailureClass.PREEMPTED else "failure"
    return _mark(kind, n, step, loss, **{"class": cls.value})


def _mark(kind: str, attempt: int, step: int, loss: float | None, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "attempt": attempt, "step": step, "loss": loss, **extra}


def _loss_at(points: list[Point], step: int) -> float | None:
    """The loss of the last point at or before ``step`` (the newest one when steps repeat)."""
    found = None
    for s, loss in points:
        if s <= step:
            found = loss
    return found


def _first_loss(runs: list[list[dict]]) -> float | None:
    return next((r["loss"] for run in runs for r in run if "loss" in r), None)
