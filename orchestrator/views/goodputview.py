"""Goodput from the job table and the run dirs: ``orch show``'s split, ``orch report``, the Prometheus gauges.

Reads attempts' times and classes (DB) and each attempt's heartbeat history (``progress.jsonl``); computes with
the pure functions of ``orchestrator.core.goodput``. No schema change: everything it needs is already recorded.
Imports no torch (read commands stay fast); SQLAlchemy only inside the functions that query.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator import protocol
from orchestrator.core.goodput import AttemptFacts, Beat, JobSplit, split_job, summarize
from orchestrator.core.goodputtime import held_over_time
from orchestrator.core.resources import partition_of
from orchestrator.errors import UsageError
from orchestrator.views.goodputrows import jobs_from_rows, report_selects

_SINCE_RE = re.compile(r"^([0-9]{1,6})([smhdw])$")
MAX_SINCE_S = 100 * 365 * 86400
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` -> a timedelta; anything else is a usage error (exit 2)."""
    m = _SINCE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise UsageError(f"--since {text[:40]!r}: expected a number and a unit s, m, h, d or w (e.g. 7d)")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > MAX_SINCE_S:  # 999999w: now - since overflowed datetime, "unexpected error" (a hostile pass)
        raise UsageError(f"--since {text[:40]!r}: at most {MAX_SINCE_S // (365 * 86400)} years (or 'all')")
    return timedelta(seconds=seconds)


def _epoch(dt: datetime | None) -> float | None:
    return None if dt is None else dt.replace(tzinfo=UTC).timestamp()


def beats_of(run_dir: str, n: int) -> tuple[Beat, ...]:
    """The attempt's heartbeat history as beats (records without a time or a step are skipped)."""
    return tuple(b for r in protocol.read_progress_history(run_dir, n) if (b := beat_of(r)) is not None)


def beat_of(r: dict[str, Any]) -> Beat | None:
    """One cleaned heartbeat record as a beat; None without a time or a step."""
    t, step = r.get("time"), r.get("step")
    if not isinstance(t, float | int) or not isinstance(step, int):
        return None
    stall = r.get("save_stall_s")
    return Beat(float(t), step, r.get("resumed_from"),
                float(stall) if isinstance(stall, float | int) and not isinstance(stall, bool) else None,
                r.get("saved_step"))


def _iso_epoch(v: Any) -> float | None:
    if not isinstance(v, str):
        return None
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


CLOCK_SLACK_S = 5.0


def held_interval(a: Any, run_dir: str, notes: list[str] | None = None) -> tuple[float | None, float | None]:
    """(start, end) of the attempt's hold: the wrapper's own records when they are this attempt's, else the DB.

    The DB's started_at/ended_at are when a reconcile pass *observed* the start and the end (a pass every
    few seconds locally, a minute on a cron): the wrapper's ``wrapper.json`` started_at and ``exit.json``
    ended_at are when the program started and exited. Each in-place restart sets the run before's wrapper.json
    aside (``wrapper.prev-<k>.json``): the first run's record is the attempt's start.

    An attempt killed with its wrapper left no exit record: its newest heartbeat is then its last sign of life.
    Those files are the job's to write, so a time in them counts only inside what the DB saw: a start
    after the submission and no later than the observed start, an end after that start and no later than
    the observed end (a hostile pass forged wrapper.json's started_at a year back and `orch report` put a
    year of held time on the fleet). ``CLOCK_SLACK_S`` allows for the node's clock against the controller's.
    A start no pass saw and no record gave is the submission (a job that ended between two passes and forged
    its wrapper.json held "nothing"). Each time ignored, and each bound taken instead, is said in ``notes``.
    """
    say = notes.append if notes is not None else (lambda _line: None)
    adir = protocol.attempt_dir(run_dir, a.n)
    start, end = _epoch(a.started_at), _epoch(a.ended_at)
    submitted = _epoch(getattr(a, "submitted_at", None))
    # The latest the program can have started: when a pass saw it run, else saw it end (an attempt that ended
    # between two passes was never seen running), else now.
    latest = start if start is not None else end if end is not None else time.time()
    first = protocol.first_run_start(run_dir, a.n, a.token)
    if (t := _iso_epoch(first)) is not None:
        if (submitted is None or t >= submitted - CLOCK_SLACK_S) and t <= latest + CLOCK_SLACK_S:
            start = min(t, latest)
        else:
            say(f"attempt {a.n}: its wrapper record's start ({first[:40]}) lies outside what orch "
                "saw (submission .. first seen running); ignored")
    if start is None and submitted is not None and end is not None:
        start = submitted
        say(f"attempt {a.n}: no start seen or recorded; held from its submission")
    if end is not None:
        rec = protocol.read_exit(adir, a.token)
        if rec is not None and (t := _iso_epoch(rec.ended_at)) is not None and start is not None and \
                start <= t <= end + CLOCK_SLACK_S:
            end = min(t, end)
        elif rec is None and start is not None and (t := _last_beat(run_dir, a.n)) is not None and \
                start <= t <= end + CLOCK_SLACK_S:
            # Killed with its wrapper (no exit record): the hold ends at its last sign of life, not at the pass that
            # noticed it (up to a cron interval of held `teardown` per kill).
            end = min(t, end)
        elif rec is not None and _iso_epoch(rec.ended_at) is not None:
            say(f"attempt {a.n}: its exit record's end ({(rec.ended_at or '')[:40]}) lies outside what orch saw; "
                "held until a pass saw it end")
    return start, end


def _last_beat(run_dir: str, n: int) -> float | None:
    """The time of the attempt's newest heartbeat, where it posted one."""
    t = (protocol.read_progress(run_dir, n) or {}).get("time")
    return float(t) if isinstance(t, float | int) and not isinstance(t, bool) else None


def attempt_facts(a: Any, run_dir: str, gpus: int | None,
                  read_beats: Callable[[str, int], tuple[Beat, ...]] | None = None) -> AttemptFacts:
    """One attempt row (models.Attempt) and its heartbeats as the pure module's input.

    Held time: the scheduler's account of each run (``attempts.runs``, sacct's Start and End) where it kept one,
    else ``held_interval`` (what reconcile passes saw, the wrapper's records only inside it)."""
    cls = a.failure_class
    notes: list[str] = []
    history = protocol.restart_history(run_dir, a.n, a.token) if a.restarts else []
    holds = scheduler_runs(getattr(a, "runs", None))
    if holds:
        started, observed_end = holds[0][0], _epoch(a.ended_at)
        ended = None if observed_end is None else (holds[-1][1] or observed_end)
    else:
        started, ended = held_interval(a, run_dir, notes)
    return AttemptFacts(n=a.n, started=started, ended=ended,
                        failure_class=getattr(cls, "value", cls), stop_reason=a.stop_reason,
                        stop_requested=_epoch(a.stop_requested_at), stale_age_s=a.stale_age_s,
                        beats=(read_beats or beats_of)(run_dir, a.n),
                        gpus=gpus, restarts=a.restarts or 0,
                        preempted_restarts=protocol.in_place_preemptions(history, a.restarts) if a.restarts else 0,
                        holds=holds, run_causes=tuple(h["class"] for h in history), notes=tuple(notes),
                        run_steps=tuple(h["step"] if isinstance(h["step"], int) else None for h in history),
                        failure_step=a.failure_step if isinstance(getattr(a, "failure_step", None), int) else None)


def scheduler_runs(stored: Any) -> tuple[tuple[float, float | None], ...]:
    """``attempts.runs`` as (start, end | None) pairs, oldest first; () when absent or not of that shape (orch
    writes it, from sacct; a hand-edited DB is no reason for a traceback)."""
    if not isinstance(stored, list):
        return ()
    out: list[tuple[float, float | None]] = []
    for r in stored:
        if not (isinstance(r, list) and len(r) == 2 and _num(r[0]) and (r[1] is None or _num(r[1]))):
            return ()
        out.append((float(r[0]), None if r[1] is None else float(r[1])))
    return tuple(out)


def _num(v: Any) -> bool:
    return isinstance(v, float | int) and not isinstance(v, bool) and 0 < v < 1 << 40


def _gpus(resources: dict[str, Any]) -> int | None:
    g = resources.get("gpus") if isinstance(resources, dict) else None
    return g if isinstance(g, int) and not isinstance(g, bool) and g >= 0 else None


def group_of(job: Any) -> dict[str, str | None]:
    part = partition_of(job.resources)
    return {"backend": job.backend, "partition": f"{job.backend}/{part or '-'}",
            "sweep": job.sweep.name if job.sweep is not None else None}


def job_split(job: Any, now: float | None = None,
              read_beats: Callable[[str, int], tuple[Beat, ...]] | None = None) -> JobSplit:
    """The split of one job (models.Job with its attempts loaded); ``read_beats``: how its heartbeats are read
    (``beats_of``; a view that stays open reads them through a ``beatcache.BeatCache``)."""
    now = time.time() if now is None else now
    gpus = _gpus(job.resources)
    facts = [attempt_facts(a, job.run_dir, gpus, read_beats) for a in job.attempts]
    return split_job(job.name, facts, _epoch(job.created_at) or now, now, group_of(job))


def show_goodput(job: Any, now: float | None = None) -> dict[str, Any]:
    """``orch show``'s ``goodput`` object: the job's totals and every attempt's split."""
    return job_split(job, now).as_dict()


def report(db: Any, since: timedelta | None, now: float | None = None) -> dict[str, Any]:
    """``orch report``: the fleet's split (jobs created or with an attempt active in the window), by partition
    (``backend/partition``) and by sweep. Through SQLAlchemy (any DB); ``goodputquick`` runs the same queries
    (``goodputrows``) through sqlite3."""
    return report_of(report_splits(db, since, now), since)


def report_splits(db: Any, since: timedelta | None, now: float | None = None,
                  split: Callable[[Any, float], JobSplit] | None = None) -> list[JobSplit]:
    """The split of each job in ``orch report``'s window, through SQLAlchemy; ``split``: how one job is split
    (``job_split``; the dashboard keeps ended jobs' splits and reads live ones' heartbeats incrementally)."""
    now = time.time() if now is None else now
    jobs_q, attempts_q = report_selects(since is not None)
    params = {}
    if since is not None:
        params = {"cutoff": datetime.fromtimestamp(now, UTC).replace(tzinfo=None) - since}
    with db.read() as s:
        jobs = jobs_from_rows(s.execute(jobs_q, params).all(), s.execute(attempts_q, params).all())
    # the heartbeat files are read after the transaction
    return [(split or job_split)(j, now) for j in jobs]


def report_of(splits: list[JobSplit], since: timedelta | None) -> dict[str, Any]:
    return {"since_s": since.total_seconds() if since is not None else None, "fleet": summarize(splits),
            "by_partition": _grouped(splits, "partition"), "by_sweep": _grouped(splits, "sweep")}


def _grouped(splits: Iterable[JobSplit], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[JobSplit]] = {}
    for j in splits:
        k = j.group.get(key)
        if k is not None:
            groups.setdefault(k, []).append(j)
    return {k: summarize(v) for k, v in sorted(groups.items())}


GAUGE_WINDOW = timedelta(days=7)


def fleet_gauges(db: Any, now: float | None = None) -> dict[str, Any]:
    """What the Prometheus gauges carry: ``orch report --since 7d``'s split by partition. Bounded to a window
    because every reconcile pass may export it, and each job in it costs a read of its heartbeat histories."""
    return by_partition(report_splits(db, GAUGE_WINDOW, now))


def by_partition(splits: list[JobSplit]) -> dict[str, dict[str, Any]]:
    """The gauges' groups alone: the fleet and sweep summaries of a whole report were ~25 % of `orch metrics`."""
    return _grouped(splits, "partition")


# A chart's bucket: the shortest of these that draws the window in at most MAX_BUCKETS points (24 h: hourly, 7 d:
# every 6 h, 30 d: daily).
BUCKET_WIDTHS_S = (3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400)
MAX_BUCKETS = 48


def goodput_over_time(splits: list[JobSplit], since: timedelta | None, now: float,
                      key: str = "partition") -> dict[str, Any]:
    """Goodput per ``key`` group in time buckets over the window (``since`` None: from the first held second):
    ``{"start", "width_s", "groups": {name: [goodput or None per bucket]}, "held_s": {name: [held per bucket]}}``.
    A bucket in which a group held nothing is None (a gap in its line, not 0 %)."""
    first = min((s for j in splits for a in j.attempts for s, _e in a.holds if math.isfinite(s)), default=now)
    # a start before the window `orch report` itself allows (a clock gone wrong) would draw millions of buckets
    start = now - since.total_seconds() if since is not None else min(max(first, now - MAX_SINCE_S), now - 3600)
    span = max(now - start, 1.0)
    width = next((w for w in BUCKET_WIDTHS_S if span / w <= MAX_BUCKETS), BUCKET_WIDTHS_S[-1])
    start = now - math.ceil(span / width) * width  # whole buckets, the last one ending now
    series = held_over_time(splits, key, start, now, width)
    return {"start": start, "width_s": width,
            "groups": {g: [u / h if h > 0 else None for h, u in bs] for g, bs in series.items()},
            "held_s": {g: [h for h, _u in bs] for g, bs in series.items()}}


# ------------------------------------------------------------------------------------------
# text
# ------------------------------------------------------------------------------------------
def dur(seconds: float | None) -> str:
    """A duration for people: 12.3 s, 4.5 min, 2.25 h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds:.3f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def split_line(seconds: dict[str, float], held: float) -> str:
    """``useful 18.4 s (33%), lost_work 4.6 s (8%), ...``: every held category that is not zero, largest first."""
    parts = sorted(((k, v) for k, v in seconds.items() if k != "waiting" and v > 0.0005), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {dur(v)}" + (f" ({100 * v / held:.0f}%)" if held > 0 else "") for k, v in parts) or "-"


def summary_lines(d: dict[str, Any]) -> list[str]:
    """Two lines for a job's or a group's totals: goodput and the held split; waiting (not held)."""
    gp = d.get("goodput")
    head = f"goodput {100 * gp:.1f}% of {dur(d['held_s'])} held" if gp is not None else "goodput - (nothing held yet)"
    gpu = d.get("gpu_seconds")
    if gpu:
        head += f" ({sum(gpu.values()) / 3600:.2f} GPU-h)"
    return [head + f"; waiting {dur(d['seconds'].get('waiting', 0.0))} (not held)",
            "held: " + split_line(d["seconds"], d["held_s"])]


# ------------------------------------------------------------------------------------------
# Prometheus (orch metrics): the same numbers as `orch report --since all`'s by_partition
# ------------------------------------------------------------------------------------------
def goodput_families(by_partition: dict[str, dict[str, Any]], family: Any) -> list[str]:
    """Gauge families for ``metrics.render`` (``family(name, kind, help, samples)`` is its formatter)."""
    def lab(part: str, **extra: str) -> str:
        labels = {"partition": part, **extra}
        return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())

    parts = sorted(by_partition.items())
    out = family("orch_goodput_seconds", "gauge",
                 "Seconds of held machine time by goodput category (docs/guides/goodput.md), per backend/partition, "
                 "over the jobs of the last 7 days (orch report --since 7d); category waiting is wall time "
                 "between attempts, not held.",
                 [(f"orch_goodput_seconds{{{lab(p, category=c)}}}", v) for p, g in parts
                  for c, v in g["seconds"].items()])
    out += family("orch_goodput_ratio", "gauge", "useful / held seconds, per backend/partition.",
                  [(f"orch_goodput_ratio{{{lab(p)}}}", g["goodput"]) for p, g in parts if g["goodput"] is not None])
    out += family("orch_goodput_preemptions_per_hour", "gauge", "Preemptions per held hour, per backend/partition.",
                  [(f"orch_goodput_preemptions_per_hour{{{lab(p)}}}", g["preemptions_per_hour"]) for p, g in parts
                   if g["preemptions_per_hour"] is not None])
    out += family("orch_goodput_unsignalled_failures", "gauge",
                  "Attempts ended by a failure with no warning (killed, node_fail, oom), per backend/partition.",
                  [(f"orch_goodput_unsignalled_failures{{{lab(p)}}}", g["unsignalled_failures"]) for p, g in parts])
    out += family("orch_goodput_mtbf_unsignalled_seconds", "gauge",
                  "Held seconds per unsignalled failure, per backend/partition (absent while there was none).",
                  [(f"orch_goodput_mtbf_unsignalled_seconds{{{lab(p)}}}", g["mtbf_unsignalled_s"]) for p, g in parts
                   if g["mtbf_unsignalled_s"] is not None])
    return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
