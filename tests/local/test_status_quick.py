"""`orch status`'s quick path (stdlib sqlite3 + the query SQLAlchemy compiles, kept in the source) prints
exactly what the SQLAlchemy path prints, imports no SQLAlchemy, and steps aside whenever the slow path must
act. No SQL is read from a file (tests/unit/test_strict_values.py checks the kept text)."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from orchestrator import protocol

CACHE = ("cache", "status-sql.json")  # what an older orch cached (SQL included): never read any more
VARIANTS = (("status",), ("status", "--json"), ("status", "--tasks"), ("status", "--state", "running"),
            ("status", "--state", "running", "--json"), ("status", "--state", "pending"))


def imported(orch, *args: str) -> set[str]:
    """Top-level modules a real `orch` process imports (`python -X importtime`)."""
    p = orch.__class__(orch.home, {**orch.env, "PYTHONPROFILEIMPORTTIME": "1"})(*args, check=True)
    return {ln.split("|")[2].strip().split(".")[0] for ln in p.stderr.splitlines()
            if ln.startswith("import time:") and ln.split("|")[0].split(":")[1].strip().isdigit()}


@pytest.fixture
def populated(orch):
    """Jobs in several states, a sweep, and a running job with a heartbeat (step and flags shown)."""
    orch("submit", "--name", "ok", "--outputs", "o.txt", "--", "sh", "-c", "echo x > o.txt", check=True)
    orch("submit", "--name", "nomarker", "--", "true", check=True)
    orch("sweep", "--name", "sw", "--grid", "x=1,2", "--outputs", "o.txt", "--", "sh", "-c", "echo x > o.txt",
         check=True)
    beat = ("import os, time; from orchestrator import protocol; "
            "protocol.write_progress(os.environ['ORCH_RUN_DIR'], 1, step=42, tokens_per_s=9.5, "
            "tokens_per_s_recent=1.0, tokens_per_s_median=10.0, samples=9); time.sleep(600)")
    orch("submit", "--name", "runs", "--", sys.executable, "-c", beat, check=True)
    try:
        orch.wait("ok", {"done_marker_verified"}, timeout=60)
        orch.wait("nomarker", {"retryable_failed"}, timeout=60)
        orch.wait("sw.0001", {"done_marker_verified"}, timeout=60)
        orch.wait("runs", {"running"}, timeout=60)
        deadline_file = protocol.attempt_dir(orch.runs / "runs", 1) / protocol.PROGRESS_FILE
        while not deadline_file.exists():
            orch("reconcile", check=True)
        yield orch
    finally:
        orch("cancel", "runs")


def _force_slow_path(orch) -> None:
    """A DB file others can read is the slow path's to tighten: the next `orch status` takes it."""
    os.chmod(orch.home / "orch.db", 0o644)


def test_fast_path_output_is_byte_identical_to_the_sqlalchemy_path(populated):
    orch = populated
    db_file = orch.home / "orch.db"
    for args in VARIANTS:
        _force_slow_path(orch)
        slow = orch(*args, check=True).stdout  # the SQLAlchemy path, which tightens the DB file
        assert stat.S_IMODE(os.stat(db_file).st_mode) == 0o600
        fast = orch(*args, check=True).stdout
        assert fast == slow, args
    rows = {r["name"]: r for r in json.loads(orch("status", "--json", check=True).stdout)}
    assert rows["runs"]["step"] == 42 and rows["runs"]["flags"] == ["slow"]
    assert rows["sw.0000"]["sweep"] == "sw" and rows["nomarker"]["failure_class"] == "marker_missing"


def test_a_warm_status_imports_no_sqlalchemy_alembic_torch_or_numpy(populated):
    orch = populated
    _force_slow_path(orch)
    cold = imported(orch, "status")
    assert "sqlalchemy" in cold and "alembic" not in cold  # the slow path: the DB is already at head
    for args in (("status",), ("status", "--json"), ("status", "--state", "running")):
        warm = imported(orch, *args)
        assert not warm & {"sqlalchemy", "alembic", "torch", "numpy", "submitit"}, (args, warm)


def test_an_older_orchs_sql_cache_is_never_run_and_is_removed(populated):
    orch = populated
    cache = orch.home.joinpath(*CACHE)
    cache.parent.mkdir(exist_ok=True)
    # a query that would show nothing: if it were run, the output would say "no jobs"
    cache.write_text(json.dumps({"all": {"sql": "SELECT 1 WHERE 0", "params": 0, "keys": ["name"]}}))
    out = orch("status", check=True).stdout
    assert "no jobs" not in out and "nomarker" in out
    _force_slow_path(orch)
    orch("status", check=True)
    assert not cache.exists()


def test_a_home_others_can_read_is_still_tightened(populated):
    orch = populated
    orch("status", check=True)  # the DB is at head: the next one would take the quick path
    os.chmod(orch.home, 0o755)
    orch("status", check=True)
    assert stat.S_IMODE(os.stat(orch.home).st_mode) == 0o700


def test_a_corrupt_db_behind_a_warm_cache_is_the_usual_one_line_error(orch):
    orch("submit", "--name", "j", "--", "true", check=True)
    orch("status", check=True)
    orch("status", check=True)
    db_file = orch.home / "orch.db"
    for side in ("orch.db-wal", "orch.db-shm"):
        (orch.home / side).unlink(missing_ok=True)
    db_file.write_bytes(b"NOT A DATABASE" + os.urandom(8192))
    data = db_file.read_bytes()
    p = orch("status")
    assert p.returncode == 1
    assert p.stderr.startswith("orch: database ") and str(db_file) in p.stderr and "Traceback" not in p.stderr
    assert db_file.read_bytes() == data
