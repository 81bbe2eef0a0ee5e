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
from pathlib import Path
from typing import Any, TypeVar

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.quickdb import at_revision, connect
from orchestrator.core.sqlitetext import SQL
from orchestrator.core.states import JobState
from orchestrator.decide.staleness import judge
from orchestrator.views.progressbounds import plausible

T = TypeVar("T")

SLOW_MIN_SAMPLES = 5


# ------------------------------------------------------------------------------------------
# the query (SQLAlchemy, imported when called) and the row it yields
# ------------------------------------------------------------------------------------------
def status_select(state: Any = None):  # a sqlalchemy Select, imported lazily
    """One row per job with its latest attempt, its attempt count and its sweep's name; ``state``: only the jobs in
    that state (a value, or a bind parameter: ``ops/statements.py`` generates the quick path's text from it)."""
    from sqlalchemy import func, select

    from orchestrator.core.models import Attempt, Job, Sweep

    latest = (select(Attempt.job_id, func.max(Attempt.n).label("n"), func.count().label("count"))
              .group_by(Attempt.job_id).subquery())
    q = (select(Job.name, Job.state, Job.backend, Job.run_dir, latest.c.count, Attempt.external_id,
                Attempt.failure_class, Attempt.n, Attempt.restarts, Sweep.name.label("sweep"), Job.task_index,
                Attempt.state.label("attempt_state"))
         .outerjoin(latest, latest.c.job_id == Job.id)
         .outerjoin(Attempt, (Attempt.job_id == Job.id) & (Attempt.n == latest.c.n))
         .outerjoin(Sweep, Sweep.id == Job.sweep_id)
         .order_by(Job.id))
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
# (SQL["status"], SQL["status_in_state"]), looked up when run. Never read from disk: the earlier cache file
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


def quick_status_rows(cfg: Config, state: str | None = None) -> list[dict[str, Any]] | None:
    """The rows of ``status_select(state)`` through :func:`quick_read`, or None: take the slow path."""
    params = {"state": state} if state else {}
    found = quick_read(cfg, lambda conn: [dict(zip(STATUS_KEYS, r, strict=True))
                                          for r in conn.execute(SQL["status_in_state" if state else "status"],
                                                                params)])
    return None if found is None else [make_row(r, cfg) for r in found]


def drop_legacy_cache(cfg: Config) -> None:
    """Remove the SQL cache an older orch wrote (best effort): it is never read, and should not look as if."""
    try:
        (cfg.home / LEGACY_CACHE_FILE).unlink(missing_ok=True)
    except OSError:
        pass


