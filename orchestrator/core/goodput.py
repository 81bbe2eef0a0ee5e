"""Goodput accounting: where a job's held machine time went, from what orch already records (pure functions).

Every second an attempt held its machine falls in exactly one category. What it held: each run the scheduler
accounted (``AttemptFacts.holds``, Slurm's per-run Start and End), else its start -> its end (or now while it
runs) as reconcile passes saw them (goodputview; the wrapper's records only inside those bounds). The job's own
heartbeat times only split a hold, never set it. The categories of an attempt add up to its held time;
``waiting`` is wall time between attempts (and between the runs of one), not held. The definitions follow
Google's ml-goodput-measurement (productive step spans, wasted progress after a disruption = a step logged
again, startup, checkpoint save time) and Meta's ETT
(allocation -> first batch, failure -> productive again); see ../shared/notes/goodput.md. Inputs, per
attempt: the DB's times and failure class, and the heartbeat history (``progress.jsonl``: wall time,
step, ``resumed_from``, and the kit's cumulative ``save_stall_s``). One run of an attempt (a Slurm in-place
requeue appends a second run to the same history; the queue between two held runs is ``waiting``)::

    started ── startup ── t_a ──── training: useful | lost | save_stall ──── t_L ── tail ── ended
                          (loop start: the beat at the resume step)      (last beat)   hang_detection
                                                                                        | teardown

* ``useful``    steps kept (up to the step the next attempt resumed from) × the attempt's step time;
* ``lost_work`` steps computed again by a later attempt × the same step time;
* ``save_stall`` the time the loop was blocked saving (the kit's ``save_stall_s``; 0 when not reported);
* ``startup``   held start -> the loop's first step (restore included): the beat at the resume step, else
                extrapolated back from the first two beats;
* ``hang_detection`` last beat -> orch asked the hung attempt to stop (a multi-rank job: the stale rank's last
                beat, ``stale_age_s`` before the stop); ``teardown`` the rest of the tail
                (stop signal -> exit, a dying node's last seconds);
* ``failed_attempt`` all of the held time of an attempt that ended in a failure without computing one step
  (a program without heartbeats: all ``useful`` when it succeeded, ``failed_attempt`` when it failed);
* ``waiting``   previous attempt's end (or the job's creation) -> this attempt's start: not held.

The step time of a run is (t_L − t_a − save stall) / steps computed, so heartbeats (written every
``ORCH_HEARTBEAT_S``) bound the error of each boundary by one heartbeat interval. Stdlib only: read
commands import this without torch or SQLAlchemy.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Category", "Beat", "AttemptFacts", "AttemptSplit", "JobSplit", "split_attempt", "split_job",
           "summarize", "UNSIGNALLED", "BADPUT"]


class Category(enum.StrEnum):
    """Where a held second went (docs/guides/goodput.md); ``waiting`` is the one that is not held."""

    USEFUL = "useful"
    LOST_WORK = "lost_work"
    STARTUP = "startup"
    SAVE_STALL = "save_stall"
    HANG_DETECTION = "hang_detection"
    TEARDOWN = "teardown"
    FAILED_ATTEMPT = "failed_attempt"
    WAITING = "waiting"  # wall time between attempts; not held, never in held totals


HELD = tuple(c for c in Category if c is not Category.WAITING)
BADPUT = tuple(c for c in HELD if c is not Category.USEFUL)
# Failures that give no warning, so only a periodic save bounds the work they lose (Daly's M counts these):
# kill -9 / a SIGKILL with no record, a node failure, an OOM kill. Signalled preemptions save on the signal.
UNSIGNALLED = frozenset({"killed", "node_fail", "oom"})


@dataclass(frozen=True, slots=True)  # slots: the dashboard keeps live attempts' beats (~130 B each, not ~310)
class Beat:
    """One heartbeat line: wall time (epoch s), last completed step, the attempt's start step, save stall so far."""

    time: float
    step: int
    resumed_from: int | None = None
    stall_s: float | None = None
    saved_step: int | None = None


@dataclass(frozen=True)
class AttemptFacts:
    """What orch knows of one attempt. Times are epoch seconds; ``ended`` None while it still runs."""

    n: int
    started: float | None
    ended: float | None
    failure_class: str | None = None
    stop_reason: str | None = None  # "hang" when orch's hang detector asked it to stop
    stop_requested: float | None = None
    # The hang stop's stale rank's age when orch stopped it (attempts.stale_age_s): the hang began at
    # stop_requested - stale_age_s, whatever rank 0 (whose beats these are) still wrote after that.
    stale_age_s: float | None = None
    beats: tuple[Beat, ...] = ()
    gpus: int | None = None
    restarts: int = 0
    # How many restarts were preemptions (protocol.in_place_preemptions); None: all of them (a NODE_FAIL
    # rerun in place is no preemption).
    preempted_restarts: int | None = None
    # The scheduler's account of each run it held (start, end; end None: the run still holds it, up to ``ended``
    # or now), oldest first. Empty: no account, the attempt held its machine from ``started`` to ``ended``.
    holds: tuple[tuple[float, float | None], ...] = ()
    # Why each run but the last ended (the restart's class: preempted, node_fail, ...), for the waits between runs.
    run_causes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # how its bounds were taken where a record was ignored (the split's assumptions)
    # The step each run but the last reached by its own report (the set-aside failure.json of an in-place restart),
    # and the step the attempt's failure report names: a kill lands between two heartbeats, and the steps after the
    # last beat were unseen (a node killed at step 119 after a beat at 100: 19 steps computed again, 0 lost_work).
    run_steps: tuple[int | None, ...] = ()
    failure_step: int | None = None


@dataclass
class AttemptSplit:
    n: int
    held_s: float
    seconds: dict[str, float]
    steps_computed: int = 0
    steps_kept: int = 0
    steps_redone: int = 0
    step_time_s: float | None = None
    cause: str | None = None  # the failure class that ended it (None: it succeeded or still runs)
    gpus: int | None = None
    restarts: int = 0  # in-place requeues by the scheduler
    preempted_restarts: int | None = None  # of them preemptions (None: all; views._preemptions' rule)
    assumptions: list[str] = field(default_factory=list)
    # Between the runs of an in-place requeue: (seconds, why the run before ended); wall time, not held.
    waits: list[tuple[float, str]] = field(default_factory=list)
    runs: int = 1  # the held runs counted (the scheduler's, or one from orch's own observations)
    held_from: str = "orch"  # "scheduler": its per-run account; "orch": what reconcile passes saw, clamped
    # The held intervals themselves (epoch s), for a fleet's goodput over time; not in ``as_dict``.
    holds: list[tuple[float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "held_s": self.held_s, "seconds": dict(self.seconds), "gpus": self.gpus,
                "steps_computed": self.steps_computed, "steps_kept": self.steps_kept,
                "steps_redone": self.steps_redone, "step_time_s": self.step_time_s, "cause": self.cause,
                "restarts": self.restarts, "runs": self.runs, "held_from": self.held_from,
                "assumptions": list(self.assumptions)}


@dataclass
class JobSplit:
    name: str
    attempts: list[AttemptSplit]
    waiting: list[tuple[float, str]]  # (seconds, cause: "queue" or the class of the attempt before)
    group: dict[str, str | None] = field(default_factory=dict)  # backend, partition, sweep

    @property
    def seconds(self) -> dict[str, float]:
        out = _zero()
        for a in self.attempts:
            for k, v in a.seconds.items():
                out[k] += v
        out[Category.WAITING.value] = sum(w for w, _ in self.waiting)
        return out

    @property
    def held_s(self) -> float:
        return sum(a.held_s for a in self.attempts)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.group, **_totals(self.seconds, self.held_s, self.gpu_seconds()),
                "attempts": [a.as_dict() for a in self.attempts],
                "waits": [{"seconds": w, "cause": c} for w, c in self.waiting]}

    def gpu_seconds(self) -> dict[str, float] | None:
        """Held seconds × GPUs per category; None unless every attempt's GPU count is known."""
        if not self.attempts or any(a.gpus is None for a in self.attempts):
            return None
        out = {c.value: 0.0 for c in HELD}
        for a in self.attempts:
            for k, v in a.seconds.items():
                out[k] += v * (a.gpus or 0)
        return out


def _zero() -> dict[str, float]:
    return {c.value: 0.0 for c in Category}


def _totals(seconds: dict[str, float], held: float, gpu: dict[str, float] | None) -> dict[str, Any]:
    return {"held_s": held, "seconds": seconds, "goodput": (seconds[Category.USEFUL] / held) if held > 0 else None,
            "gpu_seconds": gpu}


# ------------------------------------------------------------------------------------------
# one attempt
# ------------------------------------------------------------------------------------------
def starts_a_run(prev_step: int, prev_resumed: Any, step: int, resumed: Any) -> bool:
    """Whether a heartbeat begins a new run of its attempt (a Slurm in-place requeue appends the rerun's beats to
    the same history): its step goes back, or its ``resumed_from`` changes. The step alone missed the rerun of a
    job that saved on the signal and resumed at its last step (`orch plot` marked no resume). One rule for goodput
    and the plot."""
    return step < prev_step or resumed != prev_resumed


def record_runs(records: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The runs of one attempt's heartbeat records (``progress.jsonl`` lines, in file order; those without a step
    skipped), by :func:`starts_a_run`: `orch plot`'s resume marks and `orch metrics`' steps redone."""
    runs: list[list[dict[str, Any]]] = []
    for r in records:
        if "step" not in r:
            continue
        prev = runs[-1][-1] if runs else None
        if prev is None or starts_a_run(prev["step"], prev.get("resumed_from"), r["step"], r.get("resumed_from")):
            runs.append([])
        runs[-1].append(r)
    return runs


def runs_of(beats: Sequence[Beat]) -> list[list[Beat]]:
    """The runs of one attempt, by :func:`starts_a_run`."""
    runs: list[list[Beat]] = []
    for b in sorted(beats, key=lambda b: b.time):
        prev = runs[-1][-1] if runs else None
        if prev is None or starts_a_run(prev.step, prev.resumed_from, b.step, b.resumed_from):
            runs.append([])
        runs[-1].append(b)
    return runs


def _clamp(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def _split_run(run: list[Beat], start: float, end: float, kept_until: int | None, last: bool,
               ended: bool, out: AttemptSplit) -> float | None:
    """Add one run's seconds (``start`` -> its last beat) to ``out``; return the last beat's time (where the
    tail begins), or None when the run computed no step (then all of ``start`` -> ``end`` is counted)."""
    s = out.seconds
    r = run[0].resumed_from
    if r is None:
        r = run[0].step
        out.assumptions.append(f"attempt {out.n}: no resumed_from in its heartbeats; its first beat (step {r}) "
                               "taken as the start step")
    new = [b for b in run if b.step > r]
    if not new:  # never computed a step: startup while it runs or when it succeeded (nothing left to do),
        # time in a failed attempt when it ended otherwise (an earlier run of an attempt restarted in place too)
        failed = (ended and out.cause is not None) or not last
        s[Category.FAILED_ATTEMPT if failed else Category.STARTUP] += end - start
        return None
    t_last = _clamp(new[-1].time, start, end)
    s_last = max(b.step for b in new)
    at_start = [b for b in run if b.step == r and b.time <= new[0].time]
    if at_start:  # the loop-start beat (write_now at the resume step)
        t_a, base = at_start[0].time, at_start[0].stall_s or 0.0
    elif len(new) >= 2 and new[-1].step > new[0].step:
        per = (new[-1].time - new[0].time) / (new[-1].step - new[0].step)
        t_a, base = new[0].time - (new[0].step - r) * per, 0.0
        out.assumptions.append(f"attempt {out.n}: no beat at its start step; loop start extrapolated from "
                               "the step rate")
    else:
        t_a, base = start, 0.0
        out.assumptions.append(f"attempt {out.n}: one beat only; all time before it counted as training")
    t_a = _clamp(t_a, start, t_last)
    stall = _clamp((new[-1].stall_s or 0.0) - base, 0.0, t_last - t_a)
    steps = s_last - r
    training = t_last - t_a - stall
    dt = training / steps
    if kept_until is None:
        saved = [b.saved_step for b in run if b.saved_step is not None]
        # The last attempt of a job: what it computed is kept while it runs or succeeded; after a failure
        # only up to its last save (the next attempt resumes there).
        kept_until = max(saved) if ended and out.cause and saved else s_last
    kept = int(_clamp(kept_until - r, 0, steps))
    s[Category.STARTUP] += t_a - start
    s[Category.USEFUL] += kept * dt
    s[Category.LOST_WORK] += (steps - kept) * dt
    s[Category.SAVE_STALL] += stall
    out.steps_computed += steps
    out.steps_kept += kept
    out.steps_redone += steps - kept
    out.step_time_s = dt
    return t_last


# A heartbeat's time is the node's clock; a hold's bounds are the controller's or the scheduler's.
CLOCK_SLACK_S = 5.0


def split_attempt(a: AttemptFacts, kept_until: int | None, now: float) -> AttemptSplit:
    """Split attempt ``a``'s held time. ``kept_until``: the step the next attempt resumed from (None: none yet).

    Held time is each hold's length (the scheduler's runs, or orch's one observed interval); the heartbeats, whose
    times the job writes, only split a hold: a beat outside every hold is ignored, and the assumptions say so.
    """
    out = AttemptSplit(n=a.n, held_s=0.0, seconds={c.value: 0.0 for c in HELD}, cause=a.failure_class, gpus=a.gpus,
                       restarts=a.restarts, preempted_restarts=a.preempted_restarts, assumptions=list(a.notes))
    if a.started is None:
        return out
    ended = a.ended is not None
    end = max(a.ended if ended else now, a.started)
    holds = _holds(a, end)
    out.holds = holds
    out.runs, out.held_from = len(holds), "scheduler" if a.holds else "orch"
    out.held_s = sum(e - s for s, e in holds)
    out.waits = [(max(0.0, holds[i + 1][0] - holds[i][1]), a.run_causes[i] if i < len(a.run_causes) else "restart")
                 for i in range(len(holds) - 1)]
    per_hold = _beats_by_hold(a, _until_hang(a, [b for b in a.beats if math.isfinite(b.time)]), holds, out)
    if not any(per_hold):  # a program without orch's kit: nothing to split by
        cat = (Category.STARTUP if not ended else Category.USEFUL if a.failure_class is None
               else Category.FAILED_ATTEMPT)
        out.seconds[cat] = out.held_s
        out.assumptions.append(f"attempt {a.n}: no heartbeats; all held time counted as {cat.value}")
        return out
    pieces = [(h, run) for h, beats in enumerate(per_hold) for run in runs_of(beats)]
    for i, (h, run) in enumerate(pieces):
        s, e = holds[h]
        first_in_hold = i == 0 or pieces[i - 1][0] != h
        last_in_hold = i == len(pieces) - 1 or pieces[i + 1][0] != h
        last = last_in_hold and h == len(holds) - 1
        start = s if first_in_hold else _clamp(pieces[i - 1][1][-1].time, s, e)
        nxt = pieces[i + 1][1][0].resumed_from if i + 1 < len(pieces) else kept_until
        run_end = e if last_in_hold else _clamp(run[-1].time, start, e)
        tail_from = _split_run(run, start, run_end, nxt, last, ended, out)
        if tail_from is not None and last_in_hold:
            reached = a.failure_step if last and a.failure_class else \
                (a.run_steps[k] if (k := h if a.holds else i) < len(a.run_steps) and not last else None)
            tail_from = _after_last_beat(run, reached, nxt, tail_from, e, ended and a.failure_class is not None, out)
            if last:
                _split_tail(a, tail_from, e, out)
            else:  # the run's last beat -> the scheduler took the machine back
                out.seconds[Category.TEARDOWN] += e - tail_from
    for h, beats in enumerate(per_hold):
        if not beats:  # a run that wrote no heartbeat: it computed nothing
            failed = (ended and out.cause is not None) or h < len(holds) - 1
            out.seconds[Category.FAILED_ATTEMPT if failed else Category.STARTUP] += holds[h][1] - holds[h][0]
    return out


def _after_last_beat(run: list[Beat], reached: int | None, kept_until: int | None, t_last: float, end: float,
                     failed: bool, out: AttemptSplit) -> float:
    """Count the steps a run's own report says it reached after its last heartbeat, at the run's step time, out of
    its tail (never more than the tail); return where the tail now begins. Kept up to ``kept_until`` (where the
    next run resumed; unknown: none of them after a failure, all of them otherwise), the rest lost."""
    s_last, dt = max(b.step for b in run), out.step_time_s
    if reached is None or dt is None or dt <= 0 or reached <= s_last or end <= t_last:
        return t_last
    extra = reached - s_last
    spent = min(extra * dt, end - t_last)
    keep_to = kept_until if kept_until is not None else (s_last if failed else reached)
    kept = int(_clamp(keep_to - s_last, 0, extra))
    out.seconds[Category.USEFUL] += spent * kept / extra
    out.seconds[Category.LOST_WORK] += spent * (extra - kept) / extra
    out.steps_computed += extra
    out.steps_kept += kept
    out.steps_redone += extra - kept
    if extra * dt > end - t_last:
        out.assumptions.append(f"attempt {out.n}: the {extra} step(s) it reported after its last heartbeat take "
                               "longer than the time left; counted within it")
    return t_last + spent


def _holds(a: AttemptFacts, end: float) -> list[tuple[float, float]]:
    """The attempt's held intervals, in order and apart: the scheduler's runs (an open end runs to the next run's
    start, the last to ``end``), or ``started`` -> ``end``."""
    if not a.holds:
        return [(a.started if a.started is not None else end, end)]
    out: list[tuple[float, float]] = []
    for k, (s, e) in enumerate(a.holds):
        s = max(s, out[-1][1]) if out else s
        if e is None:
            e = a.holds[k + 1][0] if k + 1 < len(a.holds) else end
        out.append((s, max(s, e)))
    return out


def _beats_by_hold(a: AttemptFacts, beats: list[Beat], holds: list[tuple[float, float]],
                   out: AttemptSplit) -> list[list[Beat]]:
    """Each hold's heartbeats (by time, with ``CLOCK_SLACK_S`` for the node's clock); the others are named in the
    assumptions and ignored (a job that dated its heartbeats a year ahead turned useful time into start-up)."""
    per: list[list[Beat]] = [[] for _ in holds]
    outside = 0
    for b in beats:
        h = next((k for k, (s, e) in enumerate(holds) if s - CLOCK_SLACK_S <= b.time <= e + CLOCK_SLACK_S), None)
        if h is None:
            outside += 1
        else:
            per[h].append(b)
    if outside:
        out.assumptions.append(f"attempt {a.n}: {outside} heartbeat(s) dated outside its held time ignored "
                               "(the job writes their times; held time comes from orch and the scheduler)")
    return per


def _until_hang(a: AttemptFacts, beats: list[Beat]) -> list[Beat]:
    """The beats before the hang began, for an attempt orch stopped as hung with a stale rank's age recorded.

    The history is rank 0's; rank 1 hung while rank 0 beat on (or was first to beat, then waited):
    "last beat -> stop" from rank 0's last beat counted the hang as training. What rank 0 logged after the
    stale rank's last beat is no progress of the job (the next attempt resumes before it). The first beat is
    always kept: the attempt's start stays known (a rank that never beat counts from rank 0's first beat).
    """
    if a.stale_age_s is None or a.stop_requested is None or not beats:
        return beats
    began = a.stop_requested - a.stale_age_s
    first = min(beats, key=lambda b: b.time)
    return [b for b in beats if b.time <= began or b is first]


def _split_tail(a: AttemptFacts, t_last: float, end: float, out: AttemptSplit) -> None:
    """Last beat -> end: the hang detector's delay (to its stop request), then teardown."""
    tail = max(0.0, end - t_last)
    hung = a.stop_reason == "hang" or a.failure_class == "hang"
    if hung:
        detect = tail if a.stop_requested is None else _clamp(a.stop_requested - t_last, 0.0, tail)
        out.seconds[Category.HANG_DETECTION] += detect
        out.seconds[Category.TEARDOWN] += tail - detect
    else:
        out.seconds[Category.TEARDOWN] += tail


# ------------------------------------------------------------------------------------------
# a job, and many jobs
# ------------------------------------------------------------------------------------------
def first_resume(a: AttemptFacts) -> int | None:
    """The step attempt ``a`` resumed from (its first heartbeat's ``resumed_from``), None if unknown."""
    runs = runs_of(a.beats)
    return runs[0][0].resumed_from if runs else None


def split_job(name: str, attempts: Sequence[AttemptFacts], created: float, now: float,
              group: dict[str, str | None] | None = None) -> JobSplit:
    """Every attempt's split, each told where the next attempt that reports a resume point resumed."""
    ordered = sorted(attempts, key=lambda a: a.n)
    splits: list[AttemptSplit] = []
    waiting: list[tuple[float, str]] = []
    prev_end, prev_cause = created, "queue"
    for i, a in enumerate(ordered):
        kept_until = next((r for b in ordered[i + 1:] if (r := first_resume(b)) is not None), None)
        splits.append(split_attempt(a, kept_until, now))
        wait_end = a.started if a.started is not None else (a.ended if a.ended is not None else now)
        waiting.append((max(0.0, wait_end - prev_end), prev_cause))
        waiting.extend(splits[-1].waits)  # between the runs of an in-place requeue
        prev_end = max(prev_end, a.ended if a.ended is not None else (a.started or prev_end))
        prev_cause = a.failure_class or "ok"
    return JobSplit(name=name, attempts=splits, waiting=waiting, group=dict(group or {}))


def mtbf_unsignalled(held_s: float, failures: int) -> float | None:
    """Mean held time between failures that gave no warning; None when none was seen."""
    return held_s / failures if failures else None


def summarize(jobs: Iterable[JobSplit], top: int = 5) -> dict[str, Any]:
    """Fleet totals: the split, goodput, preemptions per held hour, mean time between unsignalled
    failures, the largest badput causes of held time (category and the failure class behind it), and the
    waiting between attempts by what ended the attempt before (``queue``: before the first)."""
    seconds, held, gpu, gpu_known = _zero(), 0.0, {c.value: 0.0 for c in HELD}, True
    preemptions = unsignalled = 0
    causes: dict[tuple[str, str], float] = {}
    waits: dict[str, float] = {}
    n_jobs = 0
    for j in jobs:
        n_jobs += 1
        held += j.held_s
        for k, v in j.seconds.items():
            seconds[k] += v
        g = j.gpu_seconds()
        if g is None:
            gpu_known = False
        else:
            for k, v in g.items():
                gpu[k] += v
        prev = "start"
        for a in j.attempts:
            preemptions += (a.cause == "preempted") + (a.restarts if a.preempted_restarts is None
                                                        else a.preempted_restarts)
            unsignalled += a.cause in UNSIGNALLED
            for k, v in a.seconds.items():
                if k == Category.USEFUL or v <= 0:
                    continue
                cause = prev if k == Category.STARTUP else (a.cause or "ok")
                causes[(k, cause)] = causes.get((k, cause), 0.0) + v
            prev = f"after {a.cause}" if a.cause else "start"
        for w, cause in j.waiting:  # wall time, not held: ranked apart from the held badput
            if w > 0:
                key = cause if cause == "queue" else f"after {cause}"
                waits[key] = waits.get(key, 0.0) + w
    ranked = sorted(causes.items(), key=lambda kv: -kv[1])[:top]
    hours = held / 3600
    return {"jobs": n_jobs, **_totals(seconds, held, gpu if gpu_known and n_jobs else None),
            "preemptions": preemptions, "preemptions_per_hour": preemptions / hours if hours > 0 else None,
            "unsignalled_failures": unsignalled, "mtbf_unsignalled_s": mtbf_unsignalled(held, unsignalled),
            "top_badput": [{"category": k, "cause": c, "seconds": v} for (k, c), v in ranked],
            "waiting_by_cause": [{"cause": c, "seconds": v} for c, v in sorted(waits.items(), key=lambda kv: -kv[1])]}
