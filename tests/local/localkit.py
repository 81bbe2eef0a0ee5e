"""Helpers for the local-backend integration tests (imported by tests/local/test_*.py only).

Kept here rather than imported from tests/conftest.py: several folders have a conftest.py and
pytest swaps the module named ``conftest`` between them, so ``from conftest import ...`` is fragile.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import orchkit
import pgkit
from orchkit import wait_for_file

from orchestrator import protocol

# A job that fails on its first attempt (after writing a partial result) and succeeds on every later
# one; it appends one line per run to ran.log, so a double launch of one attempt shows up as two lines.
FLAKY = ('echo "attempt=$ORCH_ATTEMPT pid=$$" >> "$ORCH_RUN_DIR/ran.log"; mkdir -p result; '
         'echo "partial $ORCH_ATTEMPT" > result/model.bin; [ "$ORCH_ATTEMPT" = 1 ] && exit 1; '
         'echo "complete $ORCH_ATTEMPT" > result/model.bin')
# A job that runs until the test creates <run_dir>/go, then writes its result (it gives up after
# about a minute, so a failed test leaves no process behind for long).
GATED = ('echo "attempt=$ORCH_ATTEMPT" >> "$ORCH_RUN_DIR/ran.log"; t=0; '
         'while [ ! -e go ] && [ $t -lt 1200 ]; do sleep 0.05; t=$((t+1)); done; '
         '[ -e go ] || exit 1; mkdir -p result; echo ok > result/out.txt')
# Attempt 1 waits (about a minute at most) for the test to SIGTERM it, as a preemption would;
# later attempts finish at once.
PREEMPTIBLE = ('echo "attempt=$ORCH_ATTEMPT" >> ran.log; if [ "$ORCH_ATTEMPT" = 1 ]; then t=0; '
               'while [ $t -lt 1200 ]; do sleep 0.05; t=$((t+1)); done; exit 1; fi; '
               'mkdir -p result; echo ok > result/out.txt')
# One line per run in ran.log, then its result: a job launched twice shows two lines (a duplicate launch overlaps)
ONCE = ('echo "attempt=$ORCH_ATTEMPT pid=$$" >> "$ORCH_RUN_DIR/ran.log"; sleep 0.3; mkdir -p result; '
        'echo ok > result/out.txt')
DONE = {"done_marker_verified"}
RETRYABLE = {"retryable_failed"}
NO_LAUNCH_GRACE = {"ORCH_LAUNCH_GRACE_S": "0"}  # a dead launcher's claim is not waited on


def reconcile_until_verified(orch, name: str, timeout: float = 60) -> None:
    """``orch reconcile`` (no launch grace) until ``name`` is verified, as cron would run it."""
    def verified() -> bool:
        if orch.state(name) == "done_marker_verified":
            return True
        orch("reconcile", env=NO_LAUNCH_GRACE, check=True)
        return False

    orchkit.wait_for(verified, timeout, f"{name} verified", interval=0.2, detail=lambda: orch.show(name))


def assert_ran_once(orch, name: str) -> None:
    """``name`` (an ``ONCE`` job) ran exactly once, as attempt 1, which succeeded."""
    run = orch.runs / name
    lines = (run / "ran.log").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attempt=1 pid="), lines
    assert sorted(q.name for q in (run / protocol.ATTEMPTS_DIR).iterdir()) == ["1"]
    assert db_rows(orch.home, "SELECT n, state FROM attempts") == [(1, "succeeded")]


tree_hash = orchkit.tree_hash


def db_rows(home: Path, sql: str, *params) -> list[tuple]:
    """Rows of the DB the test's orch uses: ORCH_HOME's SQLite file, or the PostgreSQL database that
    the ``postgres`` variant put in ORCH_DB_URL (tests/conftest.py)."""
    if url := os.environ.get("ORCH_DB_URL"):
        return pgkit.rows(url, sql, params)
    with sqlite3.connect(home / "orch.db") as c:
        return c.execute(sql, params).fetchall()


def db_snapshot(home: Path) -> list[tuple]:
    """Jobs and attempts as stored (minus nothing): equal snapshots mean the DB did not change."""
    return db_rows(home, "SELECT * FROM jobs ORDER BY id") + db_rows(home, "SELECT * FROM attempts ORDER BY id") \
        + db_rows(home, "SELECT * FROM events ORDER BY id")


def write_corrupt_marker(run_dir: Path, artifact: str = "result/out.txt") -> None:
    """done.json that lists an existing artifact with a wrong sha256 (an interrupted/lying writer)."""
    p = run_dir / artifact
    protocol.atomic_write_json(run_dir / protocol.DONE_MARKER, {
        "schema": 1, "job": run_dir.name, "attempt": 1, "finished_at": protocol.now_iso(),
        "artifacts": {artifact: {"size": p.stat().st_size, "sha256": "0" * 64}}})


def wrapper_record(run_dir: Path, n: int = 1) -> dict:
    p = protocol.attempt_dir(run_dir, n) / "wrapper.json"
    wait_for_file(p)
    return json.loads(p.read_text())


def trash_files(home: Path, job: str) -> dict[str, bytes]:
    """relpath-inside-the-stamp -> content, for everything trashed for ``job``."""
    out = {}
    base = home / "trash" / job
    if not base.is_dir():
        return out
    for stamp in base.iterdir():
        for p in stamp.rglob("*"):
            if p.is_file():
                out[str(p.relative_to(stamp))] = p.read_bytes()
    return out
