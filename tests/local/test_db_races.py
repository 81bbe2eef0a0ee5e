"""Races between orch processes that SQLite serialises (BEGIN IMMEDIATE: one writer at a time) and
PostgreSQL does not (READ COMMITTED: writers interleave; a duplicate key aborts the transaction), and
what a server does that a file does not (lock waits, connections it kills).

Each test makes the race happen for sure, not by chance: one side holds its transaction open (an
uncommitted row, or a submit paused at a named site), and the test waits until PostgreSQL shows
the other side blocked on a lock before it lets the first one finish.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pgkit
import pytest
from localkit import db_rows
from orchkit import wait_for
from sqlalchemy import create_engine, insert, text

from orchestrator.core.config import load_config
from orchestrator.core.db import SCHEMA_HEAD, Database
from orchestrator.core.lifecycle import utcnow
from orchestrator.core.models import Lease
from orchestrator.ops.reconcile import LEASE, acquire_lease, release_lease


def _sessions(url: str, where: str) -> int:
    """Other sessions of this database matching ``where`` (pg_stat_activity)."""
    ((n,),) = pgkit.rows(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                              f"AND pid != pg_backend_pid() AND {where}")
    return n


def _cli(orch, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env={**orch.env, **(env or {})},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.each_db
def test_first_commands_on_an_empty_db_upgrade_it_once_and_all_succeed(orch):
    # Several hosts' first commands on a new shared DB (or several cron jobs on a new ORCH_HOME).
    procs = [_cli(orch, "status") for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert (p.returncode, err) == (0, ""), (out, err)
        assert out == "no jobs\n"
    assert db_rows(orch.home, "SELECT version_num FROM alembic_version") == [(SCHEMA_HEAD,)]


@pytest.mark.each_db(only="postgres")
@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_two_reconcilers_insert_the_lease_at_once_the_loser_returns_false_and_its_session_stays_usable(
        db_url, tmp_path, first_commits):
    cfg = load_config(tmp_path / "home")
    db = Database(cfg)
    first = create_engine(db_url)
    conn = first.connect()
    conn.begin()  # the first reconciler: its lease row inserted, not yet committed
    conn.execute(insert(Lease).values(name=LEASE, holder="first", expires_at=utcnow() + timedelta(minutes=5)))
    got: list[object] = []

    def second() -> None:
        try:
            got.append(acquire_lease(db, cfg, "second"))
        except BaseException as e:  # the test reports it
            got.append(e)

    t = threading.Thread(target=second, daemon=True)
    t.start()
    # The second finds no row (the first's is uncommitted) and its INSERT waits on the primary key.
    wait_for(lambda: _sessions(db_url, "wait_event_type = 'Lock'") == 1,
             what="the second reconciler's INSERT waiting on a lock")
    if first_commits:
        conn.commit()
    else:
        conn.rollback()
    t.join(60)
    conn.close()
    first.dispose()
    assert not t.is_alive()
    if first_commits:
        assert got == [False]  # the duplicate key, rolled back to the savepoint: no error, no pass
        assert pgkit.rows(db_url, "SELECT holder FROM leases") == [("first",)]
        assert acquire_lease(db, cfg, "second") is False  # the same pooled connection, not left aborted
        release_lease(db, "first")
    else:
        assert got == [True]
        assert pgkit.rows(db_url, "SELECT holder FROM leases") == [("second",)]
        release_lease(db, "second")
    assert acquire_lease(db, cfg, "second") is True
    db.engine.dispose()


@pytest.mark.each_db(only="postgres")
@pytest.mark.parametrize("first", ["submit", "sweep"])
def test_a_second_creator_of_a_name_being_created_waits_and_is_refused(orch, tmp_path, first):
    orch("status", check=True)  # the schema exists before the race
    go = tmp_path / "go"
    argv = ["submit", "--name", "twin", "--", "true"] if first == "submit" else \
        ["sweep", "--name", "twin", "--grid", "x=1,2", "--", "true", "{x}"]
    a = _cli(orch, *argv, env={"ORCH_PAUSE_AT": "names_checked", "ORCH_PAUSE_S": "120",
                               "ORCH_PAUSE_UNTIL": str(go)})
    b = None
    try:
        url = orch.env["ORCH_DB_URL"]
        wait_for(lambda: _sessions(url, "state = 'idle in transaction'") == 1,
                 what="the first creator paused inside its write transaction")
        b = _cli(orch, "submit", "--name", "twin", "--", "true")
        # The second passed the early read check (the first's rows are uncommitted) and now waits for
        # the names lock; without that lock it would go on and insert a second "twin".
        wait_for(lambda: b.poll() is not None or _sessions(url, "wait_event_type = 'Lock'") == 1,
                 what="the second creator waiting on a lock")
        assert b.poll() is None, b.communicate()
        go.touch()
        a_out, a_err = a.communicate(timeout=120)
        b_out, b_err = b.communicate(timeout=120)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert a.returncode == 0, (a_out, a_err)
    assert (b.returncode, b_out) == (3, "")
    assert b_err == "orch: refused: 'twin' already exists (a job or a sweep); use `orch requeue twin`\n"
    jobs = [n for (n,) in db_rows(orch.home, "SELECT name FROM jobs ORDER BY name")]
    assert jobs == (["twin"] if first == "submit" else ["twin.0000", "twin.0001"])
    assert db_rows(orch.home, "SELECT count(*) FROM attempts") == [(len(jobs),)]


@pytest.mark.each_db(only="postgres")
def test_a_writer_holding_a_lock_past_busy_timeout_gives_the_locked_error_and_the_next_pass_works(orch, db_url):
    # SQLite's busy timeout, on PostgreSQL: without a lock_timeout the pass waited for ever.
    orch.write_config("[reconcile]\nbusy_timeout_ms = 300\nlease_ttl_s = 1\n")
    orch("status", check=True)
    holder_engine = create_engine(db_url)
    with holder_engine.connect() as holder:
        holder.begin()
        holder.execute(text("LOCK TABLE leases IN EXCLUSIVE MODE"))  # another writer, holding on
        t0 = time.monotonic()
        p = orch("reconcile")
        waited = time.monotonic() - t0
        assert (p.returncode, p.stdout) == (1, ""), (p.stdout, p.stderr)
        where = db_url.split("@")[-1]
        assert p.stderr == f"orch: database {where} is locked by another writer for longer than 300 ms; try again\n"
        assert waited < 20
        assert orch("status").returncode == 0  # readers are not blocked
        holder.rollback()
    holder_engine.dispose()
    p = orch("reconcile", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["ran"], (p.stdout, p.stderr)


@pytest.mark.each_db(only="postgres")
def test_reconcile_watch_carries_on_after_the_server_killed_its_idle_connections(orch, db_url):
    # A server restart or a proxy's idle timeout, as pg_terminate_backend does it: the watcher's
    # pooled connections die while it sleeps between two passes.
    orch("status", check=True)
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "reconcile", "--watch", "4", "--json"],
                               env=orch.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = "".join(iter(lambda: watcher.stdout.readline() or "}\n", "}\n")) + "}"  # one indented document
        assert json.loads(first)["ran"]  # its first pass is over: it sleeps now
        ((killed,),) = pgkit.rows(db_url, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                          "WHERE datname = current_database() AND pid != pg_backend_pid()")
        assert killed >= 1
        orch("submit", "--name", "after", "--outputs", "out.txt", "--", "sh", "-c", "echo x > out.txt", check=True)
        wait_for(lambda: watcher.poll() is not None or orch.state("after") == "done_marker_verified",
                 what="the watcher finishing the job submitted after the kill")
        assert watcher.poll() is None, watcher.communicate()[1]
    finally:
        watcher.terminate()
        watcher.wait(30)


@pytest.mark.each_db(only="postgres")
def test_reconcile_watch_carries_on_after_its_connection_died_inside_a_pass(orch, db_url, tmp_path):
    # The server restarted while the pass was recording a job's success: the loop ended for good
    # (found by a hostile run). Now that pass is cut short, says so, and the next one records it.
    orch("status", check=True)
    go = tmp_path / "go"
    env = {**orch.env, "ORCH_PAUSE_AT": "recording_success", "ORCH_PAUSE_UNTIL": str(go), "ORCH_PAUSE_S": "120"}
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "reconcile", "--watch", "0.5"],
                               env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        orch("submit", "--name", "cut", "--outputs", "out.txt", "--", "sh", "-c", "echo x > out.txt", check=True)
        # The pause site says when it is reached; a sampled 'idle in transaction' also matched a
        # read transaction of an earlier step between two statements (CI flake, stop 16).
        reached = Path(str(go) + ".reached")
        wait_for(lambda: watcher.poll() is not None or reached.exists(),
                 what="the watcher inside the transaction recording the success")
        assert _sessions(db_url, "state = 'idle in transaction'") >= 1
        assert watcher.poll() is None, watcher.communicate()
        ((killed,),) = pgkit.rows(db_url, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                          "WHERE datname = current_database() AND pid != pg_backend_pid()")
        assert killed >= 1
        assert orch.state("cut") == "submitted" or orch.state("cut") == "running"  # nothing committed
        go.touch()
        wait_for(lambda: watcher.poll() is not None or orch.state("cut") == "done_marker_verified",
                 what="the next pass recording the success")
        assert watcher.poll() is None, watcher.communicate()
    finally:
        watcher.terminate()
        out, err = watcher.communicate(timeout=30)
    assert "warning: pass interrupted: database " in err and "connection lost" in err, err
    assert "Traceback" not in err, err
