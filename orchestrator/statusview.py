"""``orch status``'s rows, and a fast path that reads them without importing SQLAlchemy.

Importing SQLAlchemy costs more than the whole latency goal of ``orch status`` on a login node
(~180 ms here; the goal is 150 ms for 1,000 jobs). The query itself is written once, with the
models' own columns (``status_select``); the slow path runs it through SQLAlchemy and then stores
the SQL text SQLAlchemy compiled for SQLite in ``$ORCH_HOME/cache/status-sql.json``, keyed by the
sources it was compiled from and by the schema revision it ran against. The fast path (stdlib
``sqlite3``) uses that text only while the key still matches and the DB is still at that
revision; anything else (no cache, another orch version, a DB to create or upgrade, a home to
tighten, PostgreSQL, any sqlite3 error) falls back to the slow path, which reports problems as
every command does. So there is no second copy of the schema: the cached SQL is derived from it.

Imports only the stdlib and ``orchestrator.protocol`` at module level.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.config import Config, sqlite_path
from orchestrator.lifecycle import JobState

SLOW_MIN_SAMPLES = 5
CACHE_FILE = Path("cache") / "status-sql.json"  # under ORCH_HOME
_HERE = Path(__file__).resolve().parent
# The files whose content decides the compiled SQL and the revision it expects.
_SOURCES = (_HERE / "models.py", _HERE / "db.py", Path(__file__).resolve())


# ------------------------------------------------------------------------------------------
# the query (SQLAlchemy, imported when called) and the row it yields
# ------------------------------------------------------------------------------------------
def status_select(state: str | None = None):  # noqa: ANN201 - a sqlalchemy Select, imported lazily
    """One row per job with its latest attempt, its attempt count and its sweep's name."""
    from sqlalchemy import func, select

    from orchestrator.models import Attempt, Job, Sweep

    latest = (select(Attempt.job_id, func.max(Attempt.n).label("n"), func.count().label("count"))
              .group_by(Attempt.job_id).subquery())
    q = (select(Job.name, Job.state, Job.backend, Job.run_dir, latest.c.count, Attempt.external_id,
                Attempt.failure_class, Attempt.n, Attempt.restarts, Sweep.name.label("sweep"), Job.task_index)
         .outerjoin(latest, latest.c.job_id == Job.id)
         .outerjoin(Attempt, (Attempt.job_id == Job.id) & (Attempt.n == latest.c.n))
         .outerjoin(Sweep, Sweep.id == Job.sweep_id)
         .order_by(Job.id))
    return q.where(Job.state == state) if state else q


def make_row(r: Mapping[str, Any], cfg: Config) -> dict[str, Any]:
    """``orch status --json``'s object for one result row (enum members or their stored strings)."""
    state, cls = _plain(r["state"]), _plain(r["failure_class"])
    row = {"name": r["name"], "state": state, "attempts": r["count"] or 0, "run_dir": r["run_dir"],
           "backend": r["backend"], "external_id": r["external_id"], "failure_class": cls,
           "restarts": r["restarts"] or 0, "step": None, "flags": [], "sweep": r["sweep"], "task": r["task_index"]}
    if state == JobState.RUNNING and r["n"]:
        _progress_flags(cfg, Path(r["run_dir"]), r["n"], row)
    elif r["n"] and state != JobState.PENDING:
        # Issue 17: STEP was "-" for every finished job; its last attempt's last heartbeat says where it got.
        row["step"] = (protocol.read_progress(Path(r["run_dir"]), r["n"]) or {}).get("step")
    return row


def _plain(v: Any) -> Any:
    return getattr(v, "value", v)


def _progress_flags(cfg: Config, run_dir: Path, n: int, row: dict[str, Any]) -> None:
    p = protocol.read_progress(run_dir, n)
    if not p:
        return
    row["step"] = p.get("step")
    row["tokens_per_s"] = p.get("tokens_per_s")
    t = p.get("time")  # read_progress type- and range-checks every field it returns
    if t is not None and time.time() - t > cfg.hang_timeout_s:
        row["flags"].append("hang")
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
        # ATT as for a job: the attempt its furthest task is on (issue 17: the sum of the tasks' attempts
        # read as the task count, 20 for 20 tasks that never failed); the sum stays in attempts_total.
        g["attempts"] = max(g["attempts"], r["attempts"])
        g["attempts_total"] += r["attempts"]
        g["counts"][r["state"]] = g["counts"].get(r["state"], 0) + 1
        g["flags"] = sorted(set(g["flags"]) | set(r["flags"]))
    for g in sweeps.values():
        g["state"] = f"sweep of {g['tasks']}: " + ", ".join(f"{n} {st}" for st, n in sorted(g["counts"].items()))
    return out


# ------------------------------------------------------------------------------------------
# the compiled-SQL cache and the fast path
# ------------------------------------------------------------------------------------------
def _key() -> str:
    h = hashlib.sha256()
    for p in _SOURCES:
        h.update(p.read_bytes())
    return h.hexdigest()


def save_compiled(cfg: Config, revision: str) -> None:
    """After the slow path (the DB is at ``revision``): store the SQL SQLAlchemy compiles for SQLite.

    Best effort: a cache that cannot be written only keeps ``orch status`` on the slow path.
    """
    if sqlite_path(cfg.db_url) is None:
        return
    from sqlalchemy.dialects import sqlite

    entry: dict[str, Any] = {"key": _key(), "revision": revision}
    for variant, state in (("all", None), ("state", JobState.RUNNING.value)):
        q = status_select(state)
        compiled = q.compile(dialect=sqlite.dialect())
        entry[variant] = {"sql": str(compiled), "params": len(compiled.positiontup or ()),
                          "keys": list(q.selected_columns.keys())}
    path = cfg.home / CACHE_FILE
    try:
        if _cached(path) == entry:
            return
        path.parent.mkdir(mode=0o700, exist_ok=True)
        protocol.atomic_write_json(path, entry)
    except OSError:
        pass


def _cached(path: Path) -> dict[str, Any] | None:
    try:
        d = protocol.read_json_bounded(path, limit=64 * 1024)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def fast_status_rows(cfg: Config, state: str | None = None) -> list[dict[str, Any]] | None:
    """The rows of ``status_select(state)`` through stdlib sqlite3, or None: take the slow path."""
    db_file = sqlite_path(cfg.db_url)
    if db_file is None or not _home_is_private(cfg.home):
        return None
    entry = _cached(cfg.home / CACHE_FILE)
    if entry is None or entry.get("key") != _key():
        return None
    variant = entry.get("state" if state else "all")
    params = (state,) if state else ()
    if not isinstance(variant, dict) or variant.get("params") != len(params):
        return None
    try:
        st = os.stat(db_file)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None  # absent or empty: the slow path creates and upgrades it
        conn = sqlite3.connect(db_file, timeout=cfg.busy_timeout_ms / 1000, isolation_level=None)
    except (OSError, sqlite3.Error):
        return None
    try:
        conn.execute(f"PRAGMA busy_timeout={int(cfg.busy_timeout_ms)}")
        conn.execute("PRAGMA query_only=ON")  # a read command: whatever the cached text says, it writes nothing
        conn.execute("BEGIN")  # the revision and the rows from one snapshot
        rev = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        if rev is None or rev[0] != entry.get("revision"):
            return None
        keys = variant["keys"]
        found = [dict(zip(keys, r, strict=True)) for r in conn.execute(variant["sql"], params)]
        conn.execute("COMMIT")
    except (sqlite3.Error, KeyError, TypeError, ValueError):
        return None  # whatever it is, the slow path says it the way every command does
    finally:
        conn.close()
    return [make_row(r, cfg) for r in found]


def _home_is_private(home: Path) -> bool:
    """What ``db.prepare_home`` would leave unchanged: our own 0700 directory, not a symlink."""
    try:
        st = os.lstat(home)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not stat.S_IMODE(st.st_mode) & 0o077
