"""Following one job, or one sweep's tasks, until it settles: what ``orch watch`` and ``orch submit --wait`` show.

A ``JobProgress`` is everything a progress display needs (job and attempt state from the DB, the latest
heartbeat from ``attempts/<n>/progress.json`` through the protocol's checked reader); ``follow`` runs
the reconcile pass the CLI hands it, as ``submit --wait`` always did, so a job progresses without cron, and hands
each snapshot to a view. No click, no terminal library: the renderers live in ``orchestrator.cli.live``.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import JOB_SETTLED, JobState
from orchestrator.errors import JobNotFound
from orchestrator.views.progressbounds import plausible
from orchestrator.views.show import sweep_of, sweep_summary
from orchestrator.views.status import sweep_state

VERIFIED = JobState.DONE.value
CLOCK_MAX_S = 999 * 86400  # an ETA beyond this shows as ">999d"
RATE_WINDOW_S = 120.0  # the ETA follows the recent speed, not the average since step 0


@dataclass(frozen=True)
class JobProgress:
    """One look at a job. ``step`` and friends are None while no heartbeat says otherwise."""

    name: str
    state: str
    attempt: int  # the latest attempt's number (0 before the first one exists)
    attempt_state: str | None
    restarts: int  # the scheduler's in-place requeues, all attempts together
    settled: bool  # the job will not move without a person (or the backoff of an auto requeue)
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    tokens_per_step: int | None = None
    beat_time: float | None = None  # the heartbeat's own clock (when the job wrote it)
    eta_s: float | None = None

    @property
    def verified(self) -> bool:
        return self.state == VERIFIED


@dataclass(frozen=True)
class SweepProgress:
    """One look at a sweep: how many of its tasks are in each state. ``settled`` once every task is (as a job is:
    nothing will move it without a person, or the back-off of an auto requeue)."""

    name: str
    tasks: int
    states: dict[str, int]
    settled: bool

    @property
    def verified(self) -> bool:
        return self.states.get(VERIFIED, 0) == self.tasks


def _settled(state: JobState, auto_requeue: bool) -> bool:
    """Nothing moves the job without a person (or the back-off of an auto requeue, which will)."""
    return state in JOB_SETTLED and not (state is JobState.RETRYABLE_FAILED and auto_requeue)


def sweep_snapshot(db: Database, name: str) -> SweepProgress | None:
    """The sweep's tasks counted by state (``sweep_summary``, as ``orch show SWEEP``); None when no sweep has that
    name."""
    sweep = sweep_of(db, name)
    if sweep is None:
        return None
    summary = sweep_summary(sweep)
    return SweepProgress(name=name, tasks=summary["tasks"], states=summary["states"],
                         settled=all(_settled(t.state, t.auto_requeue) for t in sweep.tasks))


def sweep_line(snap: SweepProgress) -> str:
    """``lr: sweep of 4: 2 done_marker_verified, 2 running``: the words of ``orch status``'s row for it."""
    return f"{snap.name}: {sweep_state(snap.tasks, snap.states)}"


def snapshot(db: Database, name: str) -> JobProgress:
    """The job's state and its latest attempt's heartbeat. Raises JobNotFound for an unknown name."""
    with db.read() as s:
        job = get_job(s, name)
        state, run_dir, auto = job.state, job.run_dir, job.auto_requeue
        last = job.attempts[-1] if job.attempts else None
        n = last.n if last else 0
        a_state = last.state.value if last else None
        restarts = sum(a.restarts or 0 for a in job.attempts)
    settled = _settled(state, auto)
    p = plausible(protocol.read_progress(run_dir, n) if n else None)  # a job's 1e308 is dropped, field by field
    return JobProgress(name=name, state=state.value, attempt=n, attempt_state=a_state, restarts=restarts,
                    settled=settled, step=p.get("step"), max_steps=p.get("max_steps"), loss=p.get("loss"),
                    tokens_per_s=p.get("tokens_per_s"), tokens_per_step=p.get("tokens_per_step"),
                    beat_time=p.get("time"))


class RateMeter:
    """Steps per second of the current attempt, from the heartbeats seen while watching.

    Each heartbeat carries the job's own timestamp, so the rate does not depend on how often we poll.
    A new attempt (or a step that went backwards: a rollback, an in-place requeue) starts over.
    Without two heartbeats yet, tokens/s over tokens/step (the bundled trainer posts both) is used.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._attempt: int | None = None
        self._samples: deque[tuple[float, int]] = deque()

    def eta_s(self, snap: JobProgress) -> float | None:
        if snap.step is None or not snap.max_steps:
            return None
        if snap.attempt != self._attempt or (self._samples and snap.step < self._samples[-1][1]):
            self._attempt = snap.attempt
            self._samples.clear()
        if snap.beat_time is not None and (not self._samples or snap.beat_time > self._samples[-1][0]):
            self._samples.append((snap.beat_time, snap.step))
            while self._samples[-1][0] - self._samples[0][0] > self.window_s and len(self._samples) > 2:
                self._samples.popleft()
        rate = None
        if len(self._samples) >= 2:
            (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
            if t1 > t0 and s1 > s0:
                rate = (s1 - s0) / (t1 - t0)
        if rate is None and snap.tokens_per_s and snap.tokens_per_step:
            rate = snap.tokens_per_s / snap.tokens_per_step
        if not rate or not math.isfinite(rate):
            return None
        eta = max(0, snap.max_steps - snap.step) / rate
        return eta if math.isfinite(eta) else None


class View:
    """What ``follow`` draws on. ``update`` gets every snapshot; ``close`` the last one (or None)."""

    def update(self, snap: JobProgress) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self, snap: JobProgress | None) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class QuietView(View):
    """Draws nothing (``--json``: stdout holds exactly one document, printed at the end)."""

    def update(self, snap: JobProgress) -> None:
        pass

    def close(self, snap: JobProgress | None) -> None:
        pass


def follow(db: Database, cfg: Config, name: str, view: View, *, poll_s: float = 1.0,
           stop: threading.Event | None = None,
           pass_fn: Callable[[Database, Config], Any] | None = None) -> JobProgress | None:
    """Reconcile and redraw until the job settles (returns its last snapshot) or ``stop`` is set
    (returns None). The view is closed either way.

    ``pass_fn``: a reconcile pass run before every look (the CLI hands ``reconcile_pass``, so nothing else needs
    to run); None only reads, for a job another host's reconciler moves. Handed in: a view runs no operation of
    its own.
    """
    meter = RateMeter()

    def look() -> JobProgress:
        snap = snapshot(db, name)
        return _with_eta(snap, meter.eta_s(snap))

    return _until_settled(look, view, poll_s, stop, db, cfg, pass_fn)


def follow_sweep(db: Database, cfg: Config, name: str, view: Any, *, poll_s: float = 1.0,
                 stop: threading.Event | None = None,
                 pass_fn: Callable[[Database, Config], Any] | None = None) -> SweepProgress | None:
    """``follow`` for a sweep: until every task settles (its last snapshot), or ``stop`` (None). The view gets
    ``SweepProgress`` snapshots."""
    def look() -> SweepProgress:
        snap = sweep_snapshot(db, name)
        if snap is None:  # the sweep's rows went away under us (the DB replaced): nothing left to follow
            raise JobNotFound(f"no job or sweep named {name!r}")
        return snap

    return _until_settled(look, view, poll_s, stop, db, cfg, pass_fn)


def _until_settled(look: Callable[[], Any], view: Any, poll_s: float, stop: threading.Event | None, db: Database,
                   cfg: Config, pass_fn: Callable[[Database, Config], Any] | None) -> Any:
    """Pass, look, draw, until the look says settled (returned) or ``stop`` is set (None); the view closed."""
    stop = stop or threading.Event()
    last = None
    try:
        while not stop.is_set():
            if pass_fn is not None:
                pass_fn(db, cfg)
            last = look()
            view.update(last)
            if last.settled:
                return last
            stop.wait(poll_s)
        return None
    finally:
        view.close(last)


def _with_eta(snap: JobProgress, eta_s: float | None) -> JobProgress:
    from dataclasses import replace

    return replace(snap, eta_s=eta_s)


# ------------------------------------------------------------------------------------------
# text both views use
# ------------------------------------------------------------------------------------------
def state_line(snap: JobProgress) -> str:
    """``NAME: STATE (attempt N, step S)``: the line ``submit --wait`` has always printed.

    Scripts match it: keep the text inside the parentheses as it is; new facts go after it.
    """
    step = f", step {snap.step}" if snap.step is not None else ""
    return f"{snap.name}: {snap.state} (attempt {snap.attempt}{step})"


def stats_text(snap: JobProgress, sep: str = "  ") -> str:
    """What the plain line adds after ``state_line``: ``max 60  loss 3.21  1.2k tok/s  ETA 0:01:10``."""
    parts = ([f"max {snap.max_steps}"] if snap.max_steps is not None else []) + measures(snap)
    if snap.restarts:
        parts.append(f"restarts {snap.restarts}")
    return sep.join(parts)


def measures(snap: JobProgress) -> list[str]:
    """Loss, speed and ETA, those known (the ETA only while the job still moves)."""
    parts = []
    if snap.loss is not None:
        parts.append(f"loss {snap.loss:.4g}")
    if snap.tokens_per_s is not None:
        parts.append(f"{human(snap.tokens_per_s)} tok/s")
    if snap.eta_s is not None and not snap.settled:
        parts.append(f"ETA {clock(snap.eta_s)}")
    return parts


def human(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def clock(seconds: float) -> str:
    # An ETA of inf seconds (a job's extreme heartbeat) made round() raise OverflowError: watch exited 1.
    if not math.isfinite(seconds) or seconds >= CLOCK_MAX_S:
        return f">{CLOCK_MAX_S // 86400}d"
    s = int(round(max(0.0, seconds)))
    if s >= 100 * 3600:
        return f"{s // 86400}d"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
