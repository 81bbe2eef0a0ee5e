"""``orch metrics``: the job table in Prometheus text format, for node_exporter's textfile collector.

Batch-job conventions (prometheus.io "instrumentation: batch jobs"): orch is not a server to
scrape, so each reconcile pass (and ``orch metrics --textfile DIR``) rewrites ``DIR/orch.prom``
atomically (tmp file in DIR, fsync, rename: node_exporter reads the old file or the new, never a
prefix; it ignores the tmp name, which does not end in ``.prom``). Every value is recomputed from
the DB: the running totals of the settled attempts, which a reconcile pass adds to in the same transaction that
marks each attempt settled (``ops/tallies.py``: a crash leaves both or neither), plus the attempts not settled yet,
from their rows and run dirs (``views/tally.py``). Every state and every failure class is listed, 0 included,
so a query never sees a series vanish. The last pass's duration and scheduler query failures are
what ``reconcile_pass`` stored in ``pass_stats``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.states import JobState
from orchestrator.errors import OrchError
from orchestrator.protocol import FailureClass
from orchestrator.views.goodputview import GAUGE_WINDOW, by_partition, fleet_gauges, goodput_families
from orchestrator.views.tally import attempt_tally, unsettled_select

if TYPE_CHECKING:  # SQLAlchemy's import was ~0.3 s of a 0.5 s `orch metrics`
    from sqlalchemy.orm import Session

    from orchestrator.core.db import Database
    from orchestrator.core.passchanges import PassReport

TEXTFILE_NAME = "orch.prom"
PASS = "reconcile"  # the pass_stats row the reconciler writes


@dataclass(frozen=True)
class LastPass:
    """The reconciler's ``pass_stats`` row, as both paths read it."""

    finished_at: datetime
    duration_s: float
    query_failures: int
    passes_total: int
    query_failures_total: int


@dataclass
class FleetMetrics:
    """What ``orch metrics`` exports, read at one moment across every job (a progress display's one-job view is
    ``progressview.JobProgress``)."""

    jobs: dict[str, int]
    failures: dict[str, int]
    last_success: datetime | None
    redone_sum: int = 0  # steps computed again after the measured preemptions
    redone_count: int = 0  # measured preemptions
    unmeasured: int = 0  # preemptions followed by an attempt whose resume step is not recorded
    last_pass: LastPass | None = None
    goodput: dict | None = None  # goodputview.fleet_gauges: the held-time split by partition
    # Ranks restarted inside their allocation (--rank-restarts), by the class of the launch each replaced, and
    # the steps each restart computed again (the failed launch's last step minus the commit it resumed from).
    rank_restarts: dict[str, int] = field(default_factory=dict)
    rank_redone_sum: int = 0
    rank_redone_count: int = 0


def record_pass(s: Session, rep: PassReport, name: str = PASS) -> None:
    """Store ``rep``'s duration and query failures (inside the caller's write transaction)."""
    from orchestrator.core.lifecycle import utcnow
    from orchestrator.core.models import PassStats

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


def metrics_selects() -> dict[str, Any]:  # sqlalchemy Selects, imported lazily
    """The queries of ``orch metrics``, written once: :func:`collect` runs them through SQLAlchemy, and
    :func:`quick_collect` the SQLite text they compile to (generated into core/sqlitetext.py by ops/statements.py)."""
    from sqlalchemy import func, select

    from orchestrator.core.models import FleetTally, Job, PassStats

    return {
        "metrics_jobs": select(Job.state, func.count()).group_by(Job.state),
        # A verified job never leaves its state, and only move_job sets updated_at: the time it got there.
        "metrics_last_success": select(func.max(Job.updated_at)).where(Job.state == JobState.DONE),
        "metrics_totals": select(FleetTally.name, FleetTally.value),
        "metrics_unsettled": unsettled_select(),
        "metrics_pass": select(PassStats.finished_at, PassStats.duration_s, PassStats.query_failures,
                               PassStats.passes_total, PassStats.query_failures_total)
        .where(PassStats.name == PASS),
    }


def collect(db: Database) -> FleetMetrics:
    """The counts: jobs by state from the job table; everything counted per attempt from the running totals of the
    settled attempts (``fleet_tallies``) plus, for the attempts not settled yet (live, or ended since the last pass),
    what their rows and run dirs say now. The cost follows the live set, not the history. Any database, through
    SQLAlchemy; ``orch metrics`` on SQLite usually takes :func:`quick_collect` (the same queries, no SQLAlchemy
    import: ~0.3 s of a 0.5 s command)."""
    q = metrics_selects()
    with db.read() as s:
        rows = {name: s.execute(stmt).all() for name, stmt in q.items()}
    return snapshot(rows, fleet_gauges(db))


def quick_collect(cfg: Config) -> FleetMetrics | None:
    """:func:`collect` through stdlib sqlite3 (``status.quick_read``: one read-only snapshot), or None: take the slow
    path."""
    from orchestrator.core.quickdb import run
    from orchestrator.views.goodputquick import quick_splits
    from orchestrator.views.status import quick_read

    names = ("metrics_jobs", "metrics_last_success", "metrics_totals", "metrics_unsettled", "metrics_pass")
    rows = quick_read(cfg, lambda conn: {name: run(conn, name).fetchall() for name in names})
    if rows is None:
        return None
    splits = quick_splits(cfg, GAUGE_WINDOW)
    return None if splits is None else snapshot(rows, by_partition(splits))


def snapshot(rows: dict[str, Any], goodput: dict[str, Any]) -> FleetMetrics:
    """The metrics from the rows of :func:`metrics_selects` (SQLAlchemy's typed values, or sqlite3's stored text) and
    the goodput gauges; the unsettled attempts' tallies read from their run dirs here, after the transaction."""
    jobs = {st.value: 0 for st in JobState}
    for st, n in rows["metrics_jobs"]:
        jobs[getattr(st, "value", st)] = n
    totals: dict[str, int] = {name: value for name, value in rows["metrics_totals"]}
    for row in rows["metrics_unsettled"]:
        for k, v in attempt_tally(*row[1:]).counts().items():
            totals[k] = totals.get(k, 0) + v
    last_pass = None
    for finished, duration, failures, passes, failures_total in rows["metrics_pass"]:
        last_pass = LastPass(_dt(finished), duration, failures, passes, failures_total)
    return FleetMetrics(
        jobs, {c.value: totals.get(f"failures/{c.value}", 0) for c in FailureClass},
        _dt(rows["metrics_last_success"][0][0]),
        redone_sum=totals.get("redone_sum", 0), redone_count=totals.get("redone_count", 0),
        unmeasured=totals.get("unmeasured", 0), last_pass=last_pass, goodput=goodput,
        rank_restarts={c.value: totals.get(f"rank_restarts/{c.value}", 0) for c in FailureClass},
        rank_redone_sum=totals.get("rank_redone_sum", 0), rank_redone_count=totals.get("rank_redone_count", 0))


def _dt(v: Any) -> datetime | None:
    return datetime.fromisoformat(v) if isinstance(v, str) else v


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
                   [("orch_preemption_steps_redone_sum", snap.redone_sum),
                    ("orch_preemption_steps_redone_count", snap.redone_count)])
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
                   [("orch_rank_restart_steps_redone_sum", snap.rank_redone_sum),
                    ("orch_rank_restart_steps_redone_count", snap.rank_redone_count)])
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
