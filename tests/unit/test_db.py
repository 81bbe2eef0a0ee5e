"""orchestrator.db: a write that waits for another process's SQLite writer lock gives up at the busy timeout with
one error naming that process (bounded, never a hang). Faults end to end: tests/reliability/test_db_faults.py,
races: tests/local/test_db_races.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from orchkit import wait_for

from orchestrator.db import Database
from orchestrator.errors import DatabaseInterrupted
from orchestrator.lifecycle import utcnow
from orchestrator.models import Lease

HOLD = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); c.execute('BEGIN IMMEDIATE'); "
        "open(sys.argv[1] + '.held', 'w').close(); time.sleep(120)")


def test_a_write_behind_another_writer_gives_up_at_the_busy_timeout_naming_it(cfg):
    db = Database(dataclasses.replace(cfg, busy_timeout_ms=300))
    path = cfg.home / "orch.db"
    with db.read():
        pass  # the schema exists before the other process takes the writer lock
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)])
    try:
        wait_for(lambda: path.with_name("orch.db.held").exists(), 30, "the other writer took the lock")
        with pytest.raises(DatabaseInterrupted) as e, db.write() as s:
            s.add(Lease(name="x", holder="me", expires_at=utcnow()))
        msg = str(e.value)
        assert f"locked by pid {p.pid}" in msg and "for longer than 300 ms" in msg, msg
    finally:
        p.kill()
        p.wait()
    with db.write() as s:  # the holder is gone: writes go through again
        s.add(Lease(name="x", holder="me", expires_at=utcnow()))
    db.engine.dispose()
