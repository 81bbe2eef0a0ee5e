"""orchestrator.core.db: a write that waits for another process's SQLite writer lock gives up at the busy timeout with
one error naming that process (bounded, never a hang). Faults end to end: tests/reliability/test_db_faults.py,
races: tests/local/test_db_races.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import pytest
from orchkit import wait_for

from orchestrator.core.db import Database
from orchestrator.core.lifecycle import utcnow
from orchestrator.core.models import Lease
from orchestrator.errors import DatabaseInterrupted

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


@pytest.mark.timeout(60)  # the busy timeout below is 120 s: waiting for the stopped writer fails here
@pytest.mark.parametrize("path", ["sqlalchemy", "quickdb"])
def test_a_write_behind_a_stopped_writer_is_refused_at_once_naming_it(cfg, path):
    """Hostile pass: an orch sweep stopped (kill -STOP, Ctrl-Z) inside one of its write transactions
    made every other writer wait the whole busy timeout. A stopped holder cannot let go: refused at once."""
    from orchestrator.core.quickdb import QuickDB

    slow = dataclasses.replace(cfg, busy_timeout_ms=120_000)
    db = Database(slow)
    path_ = cfg.home / "orch.db"
    with db.read():
        pass
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path_)])
    try:
        wait_for(lambda: path_.with_name("orch.db.held").exists(), 30, "the other writer took the lock")
        os.kill(p.pid, signal.SIGSTOP)
        with pytest.raises(DatabaseInterrupted) as e:
            if path == "sqlalchemy":
                with db.write() as s:
                    s.add(Lease(name="x", holder="me", expires_at=utcnow()))
            else:
                quick = QuickDB.open(slow)
                assert quick is not None
                try:
                    with quick.write():
                        pass
                finally:
                    quick.close()
        msg = str(e.value)
        assert f"locked by pid {p.pid} (" in msg and ", stopped); not waited for" in msg, msg
        assert f"kill -CONT {p.pid}" in msg, msg
    finally:
        p.kill()
        p.wait()
    with db.write() as s:  # the holder is gone: writes go through again, with the whole busy timeout restored
        s.add(Lease(name="x", holder="me", expires_at=utcnow()))
        assert s.connection().exec_driver_sql("PRAGMA busy_timeout").scalar() == 120_000
    db.engine.dispose()
