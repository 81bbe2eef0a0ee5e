"""The reconciler reads open attempts through ``ix_attempts_open`` (a partial index on the states not yet ended),
whatever statistics the SQLite planner holds. Taught by P1 (BENCHMARKS.md): with the per-state averages ANALYZE
writes for a 1M-attempt history, SQLite scanned every attempt for the poll's IN of three live states, and a pass
over 10,000 live jobs took 1.37x as long beside 1M finished ones as beside 10k."""

from __future__ import annotations

import importlib.util
import sqlite3
import subprocess
import sys
from pathlib import Path

from orchkit import pending_job
from sqlalchemy import event

from orchestrator.core.lifecycle import ATTEMPT_OPEN
from orchestrator.core.models import OPEN_ATTEMPT_SQL, OPEN_ATTEMPT_STATES
from orchestrator.ops.launch import launch
from orchestrator.ops.reconcile import reconcile_pass

MIGRATION = Path(__file__).resolve().parents[2] / "alembic" / "versions" / "0009_open_attempts_index.py"


def test_the_index_holds_exactly_the_attempts_lifecycle_calls_open():
    assert set(OPEN_ATTEMPT_STATES) == ATTEMPT_OPEN
    spec = importlib.util.spec_from_file_location("m0009", MIGRATION)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.OPEN == OPEN_ATTEMPT_SQL  # the migration's frozen copy is what the models' queries name


def _skewed_stats(path: Path) -> None:
    """The statistics ANALYZE writes for a P1-like history (1,010,000 jobs with one attempt each in four states, sweeps
    of 1,000 tasks): a plain index on ``state`` promises 252,500 rows per state, so an IN of three looks worse
    than a scan."""
    con = sqlite3.connect(path)
    try:
        con.execute("ANALYZE")
        con.execute("DELETE FROM sqlite_stat1 WHERE tbl IN ('attempts', 'jobs')")
        con.executemany("INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (?, ?, ?)", [
            ("attempts", "ix_attempts_state_job", "1010000 252500 1"), ("attempts", "ix_attempts_open", "10000 2500 1"),
            ("attempts", "sqlite_autoindex_attempts_1", "1010000 1 1"),
            ("attempts", "sqlite_autoindex_attempts_2", "1010000 1"),
            ("attempts", "ix_attempts_batch_token", "1010000 1010000"), ("jobs", "ix_jobs_state", "1010000 252500"),
            ("jobs", "ix_jobs_sweep_id", "1010000 1000"), ("jobs", "sqlite_autoindex_jobs_1", "1010000 1")])
        con.commit()
    finally:
        con.close()


def _plans_of(db, run) -> dict[str, list[str]]:
    """The query plan of every SELECT on attempts that ``run()`` makes, as SQLite reports it."""
    seen: list[tuple[str, object]] = []

    def keep(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "attempts" in statement:
            seen.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", keep)
    try:
        run()
    finally:
        event.remove(db.engine, "before_cursor_execute", keep)
    con = sqlite3.connect(db.engine.url.database)
    try:
        return {stmt: [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + stmt, params)] for stmt, params in seen}
    finally:
        con.close()


def _scans(plans: dict[str, list[str]]) -> dict[str, list[str]]:
    return {stmt: plan for stmt, plan in plans.items()
            if any(d.startswith(("SCAN attempts", "SCAN jobs")) for d in plan)}


def test_a_reconcile_pass_never_scans_the_history_even_with_statistics_that_favour_a_scan(db, cfg, sched):
    for name in ("live", "waiting"):
        pending_job(db, cfg, name)
    launch(db, cfg, "live", sched)  # one submitted (polled), one pending (the pending-launch query)
    db.engine.dispose()
    _skewed_stats(Path(db.engine.url.database))
    db.engine.dispose()  # new connections load the statistics
    passes = []
    plans = _plans_of(db, lambda: passes.append(reconcile_pass(db, cfg, lambda _n: sched)))
    assert passes[0].ran and passes[0].polled == 1
    assert plans and not _scans(plans), _scans(plans)



def test_the_models_import_no_postgresql_dialect_into_an_orch_command():
    # A postgresql_where on the model's index made SQLAlchemy load its PostgreSQL dialect (pg_catalog, pg8000:
    # ~25 ms) into every orch process, SQLite users' `orch submit` included; the migration carries it instead.
    code = "import sys, orchestrator.core.models; print([m for m in sys.modules if 'dialects.postgresql' in m])"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert p.stdout.strip() == "[]", p.stdout
