"""R6: the job table under upgrade, lock contention and corruption.

- Upgrade from EVERY Alembic revision (walked from the script directory, so a new migration is
  covered without touching this file) to head, on a DB populated at that revision: rows survive, the
  schema matches the models, and read commands work on the result (SQLite and PostgreSQL).
- A DB locked by another writer for longer than ``[reconcile] busy_timeout_ms``: a clear one-line
  error (exit 1, "locked"), no traceback, nothing half-done; the next pass works. Readers are not
  blocked (WAL).
- A corrupt DB file: a clear one-line error naming the file (exit 1); the file and everything else
  in ORCH_HOME are left exactly as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from orchkit import orch_for, tree_hash

from orchestrator.cli import main
from orchestrator.core.config import load_config
from orchestrator.core.db import SCHEMA_HEAD, Database, alembic_config, make_engine


def orch(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``orch ARGS`` on ``home`` in a subprocess (the shared runner, tests/orchkit.py)."""
    return orch_for(home)(*args, timeout=timeout)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    """``orch ARGS`` on ``home`` in-process (click's CliRunner), returned like a subprocess result."""
    return orch_for(home).cli(*args)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("orch: "), p.stderr
    return lines[0]


# =================================================================================================
# upgrades
# =================================================================================================
def _revisions() -> list[str | None]:
    """Every revision, oldest first, plus None for an empty (never upgraded) DB."""
    from alembic.script import ScriptDirectory

    cfg = load_config(Path("/nonexistent-orch-home"))
    cfg.db_url = "sqlite://"
    script = ScriptDirectory.from_config(alembic_config(make_engine(cfg)))
    revs = [r.revision for r in script.walk_revisions()]  # head first
    assert script.get_current_head() == SCHEMA_HEAD, "db.SCHEMA_HEAD must name Alembic's head"
    return [None, *reversed(revs)]


# What 0001 stored in its JSON columns: a decision with its plan (a NaN rollback with a backoff),
# so that an upgrade has real rows to rewrite (0002 turns them into typed retry plans).
LEGACY_ACTION = json.dumps({"action": "rollback", "auto": True, "resume_step": 10, "bad_step": 12, "lr": 0.0005,
                            "lr_before": 0.001, "skip_batches": 2, "retry_not_before": "2026-01-01T00:00:00",
                            "plan": {"one_shot": {"resume": "/runs/j/checkpoints/step-00000010"},
                                     "quarantine": ["checkpoints/step-00000011"], "prune": [],
                                     "empty_trash": False}})
ENUMS = {"failure_class": ["nan", "preempted", "crash"], "stop_reason": ["cancel", "hang", None]}


def _value(col: sa.Column, i: int) -> object:
    t = col.type
    if isinstance(t, sa.Boolean):
        return bool(i % 2)
    if isinstance(t, sa.Integer):
        return i + 1
    if isinstance(t, (sa.DateTime, sa.Date)):
        return datetime(2026, 1, 1 + i)
    if isinstance(t, sa.Float):
        return float(i)
    if isinstance(t, (sa.String, sa.Text)):
        name = col.name
        if name == "action_json":
            return LEGACY_ACTION
        if name == "plan_json":
            # Read by 0001 (one_shot ...) and by 0002+ (a flat plan always has its action: a plan without one
            # is now refused rather than read as "resume", and no orch since 0002 writes one).
            return json.dumps({"action": "resume", "one_shot": {"resume": "none"}, "quarantine": [], "prune": [],
                               "empty_trash": True})
        if name.endswith("_json"):
            return "[]" if "command" in name or "outputs" in name else "{}"
        if name in ENUMS:
            return ENUMS[name][i % 3]
        if name == "state":
            return {"jobs": ["running", "retryable_failed", "failed"]}.get(col.table.name, ["running"] * 3)[i % 3]
        if name == "run_dir":
            return f"/nonexistent/runs/job-{i}"
        return f"{name}-{i}"
    raise TypeError(f"no generator for {col.table.name}.{col.name} ({t!r}): extend _value for the new type")


def _populate(url: str, rows: int = 3) -> dict[str, int]:
    """Fill every table of the DB as it is at this revision (reflected), parents first."""
    engine = sa.create_engine(url)
    md = sa.MetaData()
    md.reflect(engine)
    counts = {}
    with engine.begin() as conn:
        for table in md.sorted_tables:
            if table.name == "alembic_version":
                continue
            values = []
            for i in range(rows):
                row = {}
                for col in table.columns:
                    if col.foreign_keys:
                        row[col.name] = i + 1  # the i-th row of the parent (ids start at 1)
                    else:
                        row[col.name] = _value(col, i)
                values.append(row)
            conn.execute(table.insert(), values)
            counts[table.name] = rows
    engine.dispose()
    return counts


@pytest.mark.each_db
@pytest.mark.parametrize("rev", _revisions(), ids=lambda r: f"from-{r or 'empty'}")
def test_upgrade_from_every_revision_to_head_keeps_the_rows(tmp_path: Path, rev: str | None,
                                                            clean_env: None, db_url: str | None) -> None:
    from alembic import command

    home = tmp_path / "home"
    cfg = load_config(home)  # SQLite in home, or the postgres variant's ORCH_DB_URL (set after clean_env)
    assert cfg.db_url == (db_url or f"sqlite:///{home / 'orch.db'}")
    home.mkdir()
    counts: dict[str, int] = {}
    if rev is not None:
        engine = make_engine(cfg)
        acfg = alembic_config(engine)
        with engine.begin() as conn:
            acfg.attributes["connection"] = conn
            command.upgrade(acfg, rev)
        engine.dispose()
        counts = _populate(cfg.db_url)
    db = Database(cfg)  # orch's own path to head (what any command does first)
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == SCHEMA_HEAD
        for table, n in counts.items():
            assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == n, table
    acfg = alembic_config(db.engine)
    with db.engine.begin() as conn:
        acfg.attributes["connection"] = conn
        command.check(acfg)  # the upgraded schema is exactly what the models say
    db.engine.dispose()
    os.environ["ORCH_HOME"] = str(home)
    # every job: the rows were made with old times, and the default shows live jobs and the last 24 h's ends
    res = CliRunner().invoke(main, ["status", "--json", "--since", "all"], prog_name="orch")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)) == counts.get("jobs", 0)
    # `orch metrics` reads every table the upgrade kept (0004 added pass_stats beside them)
    res = CliRunner().invoke(main, ["metrics"], prog_name="orch")
    assert res.exit_code == 0, res.output
    from prometheus_client.parser import text_string_to_metric_families

    by_state = {s.labels["state"]: s.value for f in text_string_to_metric_families(res.stdout)
                if f.name == "orch_jobs" for s in f.samples}
    assert sum(by_state.values()) == counts.get("jobs", 0) and len(by_state) == 7
    if counts.get("jobs"):
        res = CliRunner().invoke(main, ["show", "name-0", "--json"], prog_name="orch")
        assert res.exit_code == 0 and json.loads(res.stdout)["name"] == "name-0", res.output
    if rev == "0001":
        # 0001's decision dicts are now typed plans, with nothing lost on the way.
        res = CliRunner().invoke(main, ["show", "name-1", "--json"], prog_name="orch")
        shown = json.loads(res.stdout)
        act = shown["attempts"][0]["action"]
        assert (act["action"], act["auto"], act["resume"]) == ("rollback", True, "/runs/j/checkpoints/step-00000010")
        assert act["overrides"] == {"lr": 0.0005, "skip_batches": 2}
        assert act["quarantine"] == ["checkpoints/step-00000011"]
        assert act["details"]["resume_step"] == 10 and act["not_before"] == "2026-01-01T00:00:00"
        # the job row, retryable_failed, now carries the requeue decision the reconciler filters on
        assert shown["state"] == "retryable_failed" and shown["auto_requeue"] is True
        assert shown["retry_not_before"] == "2026-01-01T00:00:00Z"


# =================================================================================================
# a writer holding the lock past the busy timeout
# =================================================================================================
@pytest.fixture
def locked_home(tmp_path: Path, clean_env: None):
    home = tmp_path / "home"
    home.mkdir()
    (home / "orch.toml").write_text("[reconcile]\nbusy_timeout_ms = 300\nlease_ttl_s = 1\n")
    assert cli(home, "submit", "--name", "j1", "--outputs", "out.txt", "--", "sh", "-c",
               "echo x > out.txt").returncode == 0
    time.sleep(0.5)
    holder = sqlite3.connect(home / "orch.db", isolation_level=None, timeout=0.1)
    holder.execute("BEGIN IMMEDIATE")  # another writer, holding the write lock
    yield home, holder
    holder.close()


def test_locked_db_gives_a_clear_error_and_the_next_pass_works(locked_home) -> None:
    home, holder = locked_home
    t0 = time.monotonic()
    p = orch(home, "reconcile")
    waited = time.monotonic() - t0
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    line = one_error_line(p)
    assert "locked" in line and "orch.db" in line and "300 ms" in line, line
    assert waited < 20, "the busy timeout was not honoured"
    # Readers are not blocked by a writer (WAL): status works meanwhile.
    st = cli(home, "status", "--json")
    assert st.returncode == 0 and json.loads(st.stdout)[0]["state"] == "submitted", st.stderr
    # A submit refused for the lock leaves no row and no run dir behind.
    p = cli(home, "submit", "--name", "j2", "--", "true")
    assert p.returncode == 1 and "locked" in one_error_line(p)
    assert not (home / "runs" / "j2").exists()
    holder.execute("ROLLBACK")
    time.sleep(1.1)  # lease_ttl_s = 1: a lease taken by the failed pass (if any) has expired
    p = cli(home, "reconcile", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["ran"] and [c["to"] for c in rep["changed"]] == ["done_marker_verified"], rep
    st = cli(home, "status", "--json")
    assert [j["name"] for j in json.loads(st.stdout)] == ["j1"]


def test_lock_taken_in_the_middle_of_a_pass(tmp_path: Path, clean_env: None) -> None:
    """Another writer grabs the lock while the pass polls: the pass fails cleanly, and the next one
    (after the lease TTL) finishes the job; no job is left half-transitioned."""
    from orchestrator.backends.local import LocalBackend
    from orchestrator.errors import DatabaseProblem
    from orchestrator.ops.reconcile import reconcile_pass

    home = tmp_path / "home"
    home.mkdir()
    (home / "orch.toml").write_text("[reconcile]\nbusy_timeout_ms = 200\nlease_ttl_s = 1\n")
    assert cli(home, "submit", "--name", "j1", "--outputs", "out.txt", "--", "sh", "-c",
               "echo x > out.txt").returncode == 0
    time.sleep(0.5)
    cfg = load_config(home)
    db = Database(cfg)
    holder = sqlite3.connect(home / "orch.db", isolation_level=None, timeout=0.1)

    class GrabbingBackend(LocalBackend):
        def poll(self, refs):
            out = super().poll(refs)
            holder.execute("BEGIN IMMEDIATE")
            return out

    with pytest.raises(DatabaseProblem, match="locked"):
        reconcile_pass(db, cfg, backend_for=lambda _n: GrabbingBackend())
    holder.execute("ROLLBACK")
    with db.read() as s:
        state = s.execute(sa.text("SELECT state FROM jobs WHERE name = 'j1'")).scalar()
    assert state == "submitted", "a failed pass must leave the job as it was"
    time.sleep(1.1)
    p = cli(home, "reconcile", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["changed"][0]["to"] == "done_marker_verified", p.stdout
    holder.close()
    db.engine.dispose()


# =================================================================================================
# a corrupt DB file
# =================================================================================================
def _corruptions(valid: bytes) -> dict[str, bytes]:
    page = 4096
    return {
        "random bytes": hashlib.sha256(b"seed").digest() * 256,
        "truncated": valid[:1000],
        "header then zeros": valid[:100] + b"\x00" * (len(valid) - 100),
        "zeroed header": b"\x00" * 100 + valid[100:],
        "one page flipped": valid[:page] + bytes(b ^ 0xFF for b in valid[page:2 * page]) + valid[2 * page:],
        "text file": b"this is not a database\n" * 100,
    }


@pytest.fixture(scope="module")
def valid_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real orch.db holding one reconciled job, checkpointed (no -wal)."""
    home = tmp_path_factory.mktemp("valid") / "home"
    env_home = os.environ.pop("ORCH_HOME", None)
    try:
        assert cli(home, "submit", "--name", "j1", "--", "true").returncode == 0
        time.sleep(0.3)
        assert cli(home, "reconcile").returncode == 0
    finally:
        if env_home is not None:
            os.environ["ORCH_HOME"] = env_home
    con = sqlite3.connect(home / "orch.db")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return (home / "orch.db").read_bytes()


@pytest.mark.parametrize("kind", ["random bytes", "truncated", "header then zeros", "zeroed header",
                                  "one page flipped", "text file"])
def test_corrupt_db_file_gives_a_clear_error_naming_it_and_deletes_nothing(tmp_path: Path, kind: str,
                                                                          clean_env: None, valid_db: bytes) -> None:
    home = tmp_path / "home"
    (home / "runs" / "j1").mkdir(parents=True)
    (home / "runs" / "j1" / "keep.txt").write_text("a run dir orch must not touch\n")
    (home / "orch.db").write_bytes(_corruptions(valid_db)[kind])
    before = tree_hash(home)
    cmds = [["status"], ["reconcile"], ["show", "j1"], ["submit", "--name", "j2", "--", "true"]]
    for i, cmd in enumerate(cmds):
        # The real entry point for one command per kind, in-process for the rest.
        p = orch(home, *cmd) if i == hash(kind) % len(cmds) else cli(home, *cmd)
        if kind == "one page flipped" and p.returncode == 0:
            continue  # the flipped page held nothing this command reads; SQLite cannot know
        assert p.returncode == 1, (cmd, p.returncode, p.stdout, p.stderr)
        line = one_error_line(p)
        assert str(home / "orch.db") in line, line
        assert tree_hash(home) == before or _only_sqlite_sidecars_changed(home, before), \
            f"{cmd}: something in ORCH_HOME changed"
    assert not (home / "runs" / "j2").exists()


def _only_sqlite_sidecars_changed(home: Path, before: str) -> bool:
    """SQLite may create (empty) -wal/-shm files when it opens the file, and ensure_schema its lock
    file; apart from those nothing in ORCH_HOME may change."""
    import shutil
    import tempfile

    side = [p for p in home.iterdir() if p.name in ("orch.db-wal", "orch.db-shm", "orch.migrate.lock")]
    aside = Path(tempfile.mkdtemp())
    for p in side:
        shutil.move(p, aside / p.name)
    try:
        return tree_hash(home) == before
    finally:
        for p in side:
            shutil.move(aside / p.name, p)
        aside.rmdir()


def test_db_written_by_a_newer_orch_is_refused_with_a_clear_error(tmp_path: Path, clean_env: None) -> None:
    home = tmp_path / "home"
    assert orch(home, "status").returncode == 0
    con = sqlite3.connect(home / "orch.db")
    con.execute("UPDATE alembic_version SET version_num = '9999'")
    con.commit()
    con.close()
    digest = hashlib.sha256((home / "orch.db").read_bytes()).hexdigest()
    p = orch(home, "status")
    assert p.returncode == 1
    line = one_error_line(p)
    assert str(home / "orch.db") in line and "9999" in line, line
    assert hashlib.sha256((home / "orch.db").read_bytes()).hexdigest() == digest


def test_orch_db_that_is_a_directory_gives_a_clear_error(tmp_path: Path, clean_env: None) -> None:
    home = tmp_path / "home"
    (home / "orch.db").mkdir(parents=True)
    p = orch(home, "status")
    assert p.returncode == 1
    assert str(home / "orch.db") in one_error_line(p)
    assert (home / "orch.db").is_dir()
