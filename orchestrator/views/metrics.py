"""``orch metrics``: the job table in Prometheus text format, for node_exporter's textfile collector.

Batch-job conventions (prometheus.io "instrumentation: batch jobs"): orch is not a server to
scrape, so each reconcile pass (and ``orch metrics --textfile DIR``) rewrites ``DIR/orch.prom``
atomically (tmp file in DIR, fsync, rename: node_exporter reads the old file or the new, never a
prefix; it ignores the tmp name, which does not end in ``.prom``). Every value is recomputed from
the DB (and, for steps redone, two heartbeat files per preemption), so a file is never a running
tally that a crash could leave wrong. Every state and every failure class is listed, 0 included,
so a query never sees a series vanish. The last pass's duration and scheduler query failures are
what ``reconcile_pass`` stored in ``pass_stats``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.goodput import record_runs
from orchestrator.core.lifecycle import JobState, utcnow
from orchestrator.core.models import Attempt, Job, PassStats
from orchestrator.core.passchanges import PassReport
from orchestrator.errors import OrchError
from orchestrator.protocol import FailureClass
from orchestrator.views.goodputview import fleet_gauges, goodput_families

TEXTFILE_NAME = "orch.prom"
PASS = "reconcile"  # the pass_stats row the reconciler writes


@dataclass
class FleetMetrics:
    """What ``orch metrics`` exports, read at one moment across every job (a progress display's one-job view is
    ``progressview.JobProgress``)."""

    jobs: dict[str, int]
    failures: dict[str, int]
    last_success: datetime | None
    redone: list[int] = field(default_factory=list)  # one entry per measured preemption
    unmeasured: int = 0  # preemptions followed by an attempt whose resume step is not recorded
    last_pass: PassStats | None = None
    goodput: dict | None = None  # goodputview.fleet_gauges: the held-time split by partition
    # Ranks restarted inside their allocation (--rank-restarts), by the class of the launch each replaced, and
    # the steps each restart computed again (the failed launch's last step minus the commit it resumed from).
    rank_restarts: dict[str, int] = field(default_factory=dict)
    rank_redone: list[int] = field(default_factory=list)


def record_pass(s: Session, rep: PassReport, name: str = PASS) -> None:
    """Store ``rep``'s duration and query failures (inside the caller's write transaction)."""
    row = s.get(PassStats, name)
    if row is None:
        row = PassStats(name=name, passes_total=0, query_failures_total=0)
        s.add(row)
    row.finished_at = utcnow()
    row.duration_s = rep.duration_s
    row.polled = rep.polled
    row.errors = len(rep.errors)
    row.query_failures = rep.query_failures
    row.passes_total += 1
    row.query_failures_total += rep.query_failures


def collect(db: Database) -> FleetMetrics:
    """Counts from the job table; steps redone from the heartbeats of each preempted attempt and its successor."""
    with db.read() as s:
        jobs = {st.value: 0 for st in JobState}
        for st, n in s.execute(select(Job.state, func.count()).group_by(Job.state)):
            jobs[st.value] = n
        failures = {c.value: 0 for c in FailureClass}
        for cls, n in s.execute(select(Attempt.failure_class, func.count())
                                .where(Attempt.failure_class.is_not(None)).group_by(Attempt.failure_class)):
            failures[cls.value] = n
        # A verified job never leaves its state, and only move_job sets updated_at: the time it got there.
        last = s.scalar(select(func.max(Job.updated_at)).where(Job.state == JobState.DONE))
        nxt = aliased(Attempt)
        pairs = s.execute(select(Job.run_dir, Attempt.n, Attempt.failure_step)
                          .join(Job, Job.id == Attempt.job_id)
                          .join(nxt, (nxt.job_id == Attempt.job_id) & (nxt.n == Attempt.n + 1))
                          .where(Attempt.failure_class == FailureClass.PREEMPTED)).all()
        restarted = s.execute(select(Job.run_dir, Attempt.n, Attempt.token, Attempt.restarts)
                              .join(Job, Job.id == Attempt.job_id).where(Attempt.restarts > 0)).all()
        relaunched = s.execute(select(Job.run_dir, Attempt.n, Attempt.token)
                               .join(Job, Job.id == Attempt.job_id).where(Attempt.rank_restarts > 0)).all()
        stats = s.get(PassStats, PASS)
    snap = FleetMetrics(jobs, failures, last, last_pass=stats, goodput=fleet_gauges(db),
                        rank_restarts={c.value: 0 for c in FailureClass})
    for run_dir, n, failure_step in pairs:
        done = steps_redone(run_dir, n, failure_step)
        if done is None:
            snap.unmeasured += 1
        else:
            snap.redone.append(done)
    for run_dir, n, token, restarts in restarted:
        _count_in_place(snap, run_dir, n, token, restarts)
    for run_dir, n, token in relaunched:
        _count_rank_restarts(snap, run_dir, n, token)
    return snap


def _count_rank_restarts(snap: FleetMetrics, run_dir: str, n: int, token: str) -> None:
    """Each rank restart the wrapper recorded for attempt ``n``: its class and, where both steps are recorded,
    the steps the relaunched ranks computed again. Read from the record, not the DB's count: a pass that has not
    seen the last restart yet undercounts by it until the next pass, never counts one twice."""
    for r in protocol.read_rank_restarts(protocol.attempt_dir(run_dir, n), token):
        snap.rank_restarts[r["class"]] = snap.rank_restarts.get(r["class"], 0) + 1
        if r["failed_step"] is not None and r["resume_step"] is not None:
            snap.rank_redone.append(max(0, r["failed_step"] - r["resume_step"]))


def _count_in_place(snap: FleetMetrics, run_dir: str, n: int, token: str, restarts: int) -> None:
    """A Slurm in-place requeue reruns the same attempt: each earlier run is a failure of its class (from
    the records it set aside; ``preempted`` without one) and, for a preemption, a measurement of the steps
    redone. After 8 real in-place preemptions both counts were 0."""
    history = protocol.restart_history(run_dir, n, token)
    classes = [h["class"] for h in history][:restarts] + ["preempted"] * max(0, restarts - len(history))
    redone = in_place_steps_redone(run_dir, n, history, restarts)
    for k, cls in enumerate(classes):
        if cls in snap.failures:
            snap.failures[cls] += 1
        if cls != FailureClass.PREEMPTED.value:
            continue
        if redone[k] is None:
            snap.unmeasured += 1
        else:
            snap.redone.append(redone[k])


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


# ------------------------------------------------------------------------------------------
# exposition (text format 0.0.4)
# ------------------------------------------------------------------------------------------
def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    return lines + [f"{suffix} {_num(v)}" for suffix, v in samples]


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _epoch(dt: datetime) -> float:
    return dt.replace(tzinfo=UTC).timestamp()


def render(snap: FleetMetrics) -> str:
    out: list[str] = []
    out += _family("orch_jobs", "gauge", "Jobs in each state (every state listed, 0 included).",
                   [(f'orch_jobs{{state="{k}"}}', v) for k, v in snap.jobs.items()])
    out += _family("orch_attempt_failures", "gauge",
                   "Attempts that ended without a verified marker, by failure class (every class listed, "
                   "0 included), plus each in-place restart of an attempt by the scheduler (a Slurm requeue in "
                   "place), by the class of the run it ended; counted from the attempts table and the records "
                   "each restart set aside, so it only grows.",
                   [(f'orch_attempt_failures{{class="{k}"}}', v) for k, v in snap.failures.items()])
    out += _family("orch_last_success_timestamp_seconds", "gauge",
                   "Unix time a job last reached done_marker_verified (absent until one has).",
                   [("orch_last_success_timestamp_seconds", _epoch(snap.last_success))] if snap.last_success else [])
    out += _family("orch_preemption_steps_redone", "summary",
                   "Steps computed again after a preemption: last step the preempted attempt reported "
                   "(failure.json or its last heartbeat, which lags by up to one heartbeat interval) minus "
                   "the step the next attempt (or the next run of an attempt restarted in place) resumed from (its "
                   "heartbeats' resumed_from). One observation per preemption whose resume step is recorded.",
                   [("orch_preemption_steps_redone_sum", sum(snap.redone)),
                    ("orch_preemption_steps_redone_count", len(snap.redone))])
    out += _family("orch_preemptions_unmeasured", "gauge",
                   "Preempted attempts with a successor whose resume step is not recorded (a program that "
                   "writes no resumed_from heartbeat field): not in orch_preemption_steps_redone.",
                   [("orch_preemptions_unmeasured", snap.unmeasured)])
    out += _family("orch_rank_restarts", "gauge",
                   "Launches of a multi-rank program's ranks replaced inside the job's own allocation "
                   "(--rank-restarts), by the class of the launch that failed (every class listed, 0 included). "
                   "Not in orch_attempt_failures: the attempt went on.",
                   [(f'orch_rank_restarts{{class="{k}"}}', v) for k, v in snap.rank_restarts.items()])
    out += _family("orch_rank_restart_steps_redone", "summary",
                   "Steps computed again after a rank restart: the failed launch's last step minus the committed "
                   "step the relaunched ranks resumed from. One observation per restart with both recorded.",
                   [("orch_rank_restart_steps_redone_sum", sum(snap.rank_redone)),
                    ("orch_rank_restart_steps_redone_count", len(snap.rank_redone))])
    out += goodput_families(snap.goodput or {}, _family)
    p = snap.last_pass
    if p is not None:
        out += _family("orch_reconcile_last_pass_duration_seconds", "gauge",
                       "Wall time of the last reconcile pass that held the lease.",
                       [("orch_reconcile_last_pass_duration_seconds", p.duration_s)])
        out += _family("orch_reconcile_last_pass_timestamp_seconds", "gauge",
                       "Unix time the last reconcile pass ended.",
                       [("orch_reconcile_last_pass_timestamp_seconds", _epoch(p.finished_at))])
        out += _family("orch_reconcile_last_pass_scheduler_query_failures", "gauge",
                       "Scheduler queries (sacct, squeue, a backend's poll or lookup by token) that failed or "
                       "timed out in the last pass; their attempts kept their state.",
                       [("orch_reconcile_last_pass_scheduler_query_failures", p.query_failures)])
        out += _family("orch_reconcile_passes_total", "counter", "Reconcile passes that held the lease.",
                       [("orch_reconcile_passes_total", p.passes_total)])
        out += _family("orch_scheduler_query_failures_total", "counter",
                       "Scheduler queries that failed or timed out, over every pass.",
                       [("orch_scheduler_query_failures_total", p.query_failures_total)])
    return "\n".join(out) + "\n"


def write_textfile(directory: Path, text: str) -> Path:
    """``directory/orch.prom``, replaced atomically; world-readable (node_exporter runs as another user)."""
    path = Path(directory) / TEXTFILE_NAME
    protocol.atomic_write(path, text, mode=0o644)
    return path


def export_after_pass(db: Database, cfg: Config, rep: PassReport) -> None:
    """The reconciler's export when ``[metrics] textfile_dir`` is set; a failure is a pass warning, never fatal."""
    if cfg.metrics_textfile_dir is None:
        return
    try:
        write_textfile(cfg.metrics_textfile_dir, render(collect(db)))
    except OSError as e:
        rep.errors.append(f"metrics: cannot write {cfg.metrics_textfile_dir / TEXTFILE_NAME}: "
                          f"{e.strerror or e}")
    except OrchError as e:  # e.g. the DB locked past the busy timeout: the next pass writes it
        rep.errors.append(f"metrics: not written: {e}")
