"""`orch status`'s fast path (stdlib sqlite3 + the query SQLAlchemy compiled once) prints exactly what
the SQLAlchemy path prints, imports no SQLAlchemy, and steps aside whenever the slow path must act."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from orchestrator import protocol

CACHE = ("cache", "status-sql.json")
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


def test_fast_path_output_is_byte_identical_to_the_sqlalchemy_path(populated):
    orch = populated
    cache = orch.home.joinpath(*CACHE)
    for args in VARIANTS:
        cache.unlink(missing_ok=True)
        slow = orch(*args, check=True).stdout  # no cache: the SQLAlchemy path, which writes the cache
        assert cache.exists()
        fast = orch(*args, check=True).stdout
        assert fast == slow, args
    rows = {r["name"]: r for r in json.loads(orch("status", "--json", check=True).stdout)}
    assert rows["runs"]["step"] == 42 and rows["runs"]["flags"] == ["slow"]
    assert rows["sw.0000"]["sweep"] == "sw" and rows["nomarker"]["failure_class"] == "marker_missing"


def test_a_warm_status_imports_no_sqlalchemy_alembic_torch_or_numpy(populated):
    orch = populated
    orch.home.joinpath(*CACHE).unlink(missing_ok=True)
    cold = imported(orch, "status")
    assert "sqlalchemy" in cold and "alembic" not in cold  # the slow path: the DB is already at head
    for args in (("status",), ("status", "--json"), ("status", "--state", "running")):
        warm = imported(orch, *args)
        assert not warm & {"sqlalchemy", "alembic", "torch", "numpy", "submitit"}, (args, warm)


def test_a_stale_cache_is_recompiled_and_never_trusted(populated):
    orch = populated
    cache = orch.home.joinpath(*CACHE)
    orch("status", check=True)
    entry = json.loads(cache.read_text())
    # compiled by another orch (another source key), or against another schema revision
    for change in ({"key": "0" * 64}, {"revision": "0001"}):
        # a query that would show nothing: if it were run, the output would say "no jobs"
        bad = {**entry, **change, "all": {**entry["all"], "sql": entry["all"]["sql"].replace(
            "ORDER BY", "WHERE 0 ORDER BY")}}
        cache.write_text(json.dumps(bad))
        out = orch("status", check=True).stdout
        assert "no jobs" not in out and "nomarker" in out
        assert json.loads(cache.read_text()) == entry  # the slow path stored the right one again


def test_a_home_others_can_read_is_still_tightened(populated):
    orch = populated
    orch("status", check=True)  # the cache is warm
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
