"""``orch status``'s rows, and a quick path that reads them without importing SQLAlchemy.

Importing SQLAlchemy costs more than the whole latency goal of ``orch status`` on a login node
(~180 ms here; the goal is 150 ms for 1,000 jobs). The query itself is written once, with the
models' own columns (``status_select``); the slow path runs it through SQLAlchemy. The quick path
(stdlib ``sqlite3``) runs the text SQLAlchemy compiles that query to for SQLite, generated
into ``core/sqlitetext.py`` with the quick path's other statements (``ops/statements.py``), and only while the
DB is at ``schema.SCHEMA_HEAD``; anything else (a DB to create or upgrade, a home or DB file to tighten,
PostgreSQL, any sqlite3 error) falls back to the slow path, which reports problems as every
command does. No SQL is ever read from a file.

Imports only the stdlib, ``orchestrator.protocol`` and stdlib-only orch modules (config, states,
progressvalues, staleness) at module level.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.quickdb import at_revision, connect, run
from orchestrator.core.states import JobState
from orchestrator.decide.staleness import judge
from orchestrator.views.progressbounds import plausible

T = TypeVar("T")

SLOW_MIN_SAMPLES = 5
# The states a job stays in until a person acts (requeue revives failed and cancelled): a windowed `orch status`
# shows a job in one only if it got there since the cutoff.
ENDED = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
LIVE = tuple(s.value for s in JobState if s not in ENDED)


# ------------------------------------------------------------------------------------------
# the query (SQLAlchemy, imported when called) and the row it yields
# ------------------------------------------------------------------------------------------
def status_select(state: Any = None, windowed: bool = False):  # a sqlalchemy Select, imported lazily
    """One row per job with its latest attempt, its attempt count and its sweep's name; ``state``: only the jobs in
    that state (a value, or a bind parameter: ``ops/statements.py`` generates the quick path's text from it).

    ``windowed``: only the jobs that are live (not in an ``ENDED`` state) or moved since the bind parameter
    ``cutoff`` (an ended job's ``updated_at`` is when it ended), and every task of a sweep that has one such task (a
    sweep's row counts all its tasks). ``orch status``'s default: at 100,000 mostly finished jobs the whole table
    took 3.6 s (a heartbeat read per finished job, and the latest attempts grouped over the whole attempts table);
    the window goes through indexes, and each job's latest attempt is found by its own."""
    from sqlalchemy import bindparam, func, select, union
    from sqlalchemy.orm import aliased

    from orchestrator.core.models import Attempt, Job, Sweep

    other = aliased(Attempt)
    latest_n = select(func.max(other.n)).where(other.job_id == Job.id).correlate(Job).scalar_subquery()
    count = select(func.count()).select_from(other).where(other.job_id == Job.id).correlate(Job).scalar_subquery()
    q = (select(Job.name, Job.state, Job.backend, Job.run_dir, count.label("count"), Attempt.external_id,
                Attempt.failure_class, Attempt.n, Attempt.restarts, Sweep.name.label("sweep"), Job.task_index,
                Attempt.state.label("attempt_state"))
         .select_from(Job)
         .outerjoin(Attempt, (Attempt.job_id == Job.id) & (Attempt.n == latest_n))
         .outerjoin(Sweep, Sweep.id == Job.sweep_id)
         .order_by(Job.id))
    if windowed:
        # One list of ids, each part through its own index (the live states through ix_jobs_state, a move since the
        # cutoff through ix_jobs_updated_at, a shown sweep's tasks through ix_jobs_sweep_id): an OR of the same
        # terms let SQLite's planner scan every job once ANALYZE had counted the states (37-83 ms at 100,000).
        recent = union(select(Job.id, Job.sweep_id).where(Job.state.in_(LIVE)),
                       select(Job.id, Job.sweep_id).where(Job.updated_at >= bindparam("cutoff"))).cte("recent")
        task = aliased(Job)
        q = q.where(Job.id.in_(union(select(recent.c.id),
                                     select(task.id).where(task.sweep_id.in_(select(recent.c.sweep_id))))))
    return q.where(Job.state == state) if state is not None else q


def count_select(state: Any = None):  # a sqlalchemy Select, imported lazily
    """How many jobs there are (in ``state``): what a windowed ``orch status`` says it left out."""
    from sqlalchemy import func, select

    from orchestrator.core.models import Job

    q = select(func.count()).select_from(Job)
    return q.where(Job.state == state) if state is not None else q


def make_row(r: Mapping[str, Any], cfg: Config) -> dict[str, Any]:
    """``orch status --json``'s object for one result row (enum members or their stored strings)."""
    state, cls = _plain(r["state"]), _plain(r["failure_class"])
    row = {"name": r["name"], "state": state, "attempts": r["count"] or 0, "run_dir": r["run_dir"],
           "backend": r["backend"], "external_id": r["external_id"], "failure_class": cls,
           "restarts": r["restarts"] or 0, "step": None, "flags": [], "sweep": r["sweep"], "task": r["task_index"],
           # `cancelled` while the process still ran: the job's state is one of the 7 contract strings, and
           # its latest attempt's own state (e.g. stopping) says whether anything still runs.
           "attempt_state": _plain(r["attempt_state"])}
    if state == JobState.RUNNING and r["n"]:
        _progress_flags(cfg, Path(r["run_dir"]), r["n"], row)
    elif r["n"] and state != JobState.PENDING:
        # STEP was "-" for every finished job; its last attempt's last heartbeat says where it got.
        row["step"] = (protocol.read_progress(Path(r["run_dir"]), r["n"]) or {}).get("step")
    return row


def _plain(v: Any) -> Any:
    return getattr(v, "value", v)


def _progress_flags(cfg: Config, run_dir: Path, n: int, row: dict[str, Any]) -> None:
    raw = protocol.read_progress(run_dir, n)
    # The hang stop's own rule (any rank's beat, by file mtimes; the rank files only when progress.json names a
    # world size > 1): the flag read rank 0's job-written "time" alone, so a hung rank 1 showed a healthy row.
    # Judged before any heartbeat too (the armed ranks of a start-up hang: the hostile pass saw no flag there).
    # redate=False: a read command writes nothing to a job's files.
    if judge(run_dir, n, cfg.hang_timeout_s, time.time(), redate=False, progress=raw) is not None:
        row["flags"].append("hang")
    p = plausible(raw)  # no 1e308 tok/s shown as measured
    if not p:
        return
    row["step"] = p.get("step")
    row["tokens_per_s"] = p.get("tokens_per_s")
    tps, med = p.get("tokens_per_s_recent"), p.get("tokens_per_s_median")
    if (tps is not None and med is not None and med > 0
            and p.get("samples", SLOW_MIN_SAMPLES) >= SLOW_MIN_SAMPLES and tps < cfg.slow_factor * med):
        row["flags"].append("slow")


def group_by_sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``orch status``'s table: one row per plain job, one per sweep (its tasks' states counted; ATT the most
    attempts any task has had)."""
    out: list[dict[str, Any]] = []
    sweeps: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.get("sweep"):
            out.append(r)
            continue
        g = sweeps.get(r["sweep"])
        if g is None:
            g = sweeps[r["sweep"]] = {"name": r["sweep"], "state": "", "attempts": 0, "attempts_total": 0,
                                      "backend": r["backend"], "external_id": None, "step": None,
                                      "failure_class": None, "flags": [], "counts": {}, "tasks": 0}
            out.append(g)
        g["tasks"] += 1
        # ATT as for a job: the attempt its furthest task is on (the sum of the tasks' attempts
        # read as the task count, 20 for 20 tasks that never failed); the sum stays in attempts_total.
        g["attempts"] = max(g["attempts"], r["attempts"])
        g["attempts_total"] += r["attempts"]
        g["counts"][r["state"]] = g["counts"].get(r["state"], 0) + 1
        g["flags"] = sorted(set(g["flags"]) | set(r["flags"]))
    for g in sweeps.values():
        g["state"] = sweep_state(g["tasks"], g["counts"])
    return out


def sweep_state(tasks: int, counts: Mapping[str, int]) -> str:
    """``sweep of 9: 7 done_marker_verified, 2 running``: a sweep's tasks counted by state (``orch status``'s
    STATE column, ``orch watch SWEEP``'s lines)."""
    return f"sweep of {tasks}: " + ", ".join(f"{n} {st}" for st, n in sorted(counts.items()))


# ------------------------------------------------------------------------------------------
# the quick path: the text SQLAlchemy compiles ``status_select`` to for SQLite, generated into core/sqlitetext.py
# ------------------------------------------------------------------------------------------
# (SQL["status"], SQL["status_in_state_since"], ...), looked up when run. Never read from disk: the earlier cache file
# ($ORCH_HOME/cache/status-sql.json) ran whatever SQL a hand edit put in it (an ATTACH created files), since a
# file's SQL cannot be trusted without recompiling it.
STATUS_KEYS = ("name", "state", "backend", "run_dir", "count", "external_id", "failure_class", "n", "restarts",
               "sweep", "task_index", "attempt_state")
LEGACY_CACHE_FILE = Path("cache") / "status-sql.json"  # under ORCH_HOME: written by older orch, never read


def quick_read(cfg: Config, query: Callable[[sqlite3.Connection], T]) -> T | None:
    """``query(conn)`` on the DB through stdlib sqlite3 in one read-only snapshot, or None: take the slow path.

    Only for a DB that the slow path would leave as it is: a regular, non-empty file of ours that others
    cannot read, in a private home, at ``schema.SCHEMA_HEAD`` (anything else, PostgreSQL and any sqlite3
    error included, goes to the slow path, which creates, upgrades, tightens or reports). The read commands'
    one gate (orch status, orch report), so none can drift from the others' rules."""
    conn = connect(cfg)
    if conn is None:
        return None
    try:
        conn.execute("PRAGMA query_only=ON")  # a read command writes nothing
        conn.execute("BEGIN")  # the revision and every query from one snapshot
        if not at_revision(conn):
            return None
        found = query(conn)
        conn.execute("COMMIT")
    except (sqlite3.Error, KeyError, TypeError, ValueError):
        return None  # whatever it is, the slow path says it the way every command does
    finally:
        conn.close()
    return found


def status_statement(state: str | None, cutoff: Any) -> str:
    """The name of ``status_select``'s text for these arguments in ``core/sqlitetext.py``."""
    return "status" + ("_in_state" if state else "") + ("_since" if cutoff is not None else "")


def sql_time(dt: datetime) -> str:
    """``dt`` (naive UTC) as SQLAlchemy stores a DateTime in SQLite: always with microseconds, so strings compare as
    times."""
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f")


def quick_status_rows(cfg: Config, state: str | None = None,
                      cutoff: datetime | None = None) -> tuple[list[dict[str, Any]], int] | None:
    """(the rows of ``status_select(state, windowed=cutoff is not None)``, how many jobs there are in ``state``)
    through :func:`quick_read`, or None: take the slow path."""
    params: dict[str, Any] = {"state": state} if state else {}
    if cutoff is not None:
        params["cutoff"] = sql_time(cutoff)

    def query(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int]:
        rows = [dict(zip(STATUS_KEYS, r, strict=True)) for r in run(conn, status_statement(state, cutoff), **params)]
        total = run(conn, "status_count_in_state" if state else "status_count",
                    **({"state": state} if state else {})).fetchone()[0]
        return rows, total

    found = quick_read(cfg, query)
    return None if found is None else ([make_row(r, cfg) for r in found[0]], found[1])


def drop_legacy_cache(cfg: Config) -> None:
    """Remove the SQL cache an older orch wrote (best effort): it is never read, and should not look as if."""
    try:
        (cfg.home / LEGACY_CACHE_FILE).unlink(missing_ok=True)
    except OSError:
        pass


