"""The quick path's SQL is generated from the models (ops/statements.py -> core/sqlitetext.py), never written by hand:
the checked-in module is what the generator writes today, and no module of the quick path spells SQL of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from orchestrator.core import sqlitetext
from orchestrator.ops import statements

ROOT = Path(__file__).resolve().parents[2]
# The modules that run SQL on stdlib sqlite3; a read built from user input goes through placeholders only
QUICK = ("orchestrator/core/quickdb.py", "orchestrator/ops/quicksubmit.py", "orchestrator/ops/quicksweep.py")
SQL_WORDS = ("INSERT ", "UPDATE ", "DELETE ", "REPLACE ", "UPSERT")


def test_the_generated_module_is_what_the_statements_compile_to_today():
    """On failure: python -m orchestrator.ops.statements --write, and read the diff."""
    assert statements.TARGET.read_text() == statements.generate()


def test_the_check_command_says_when_the_module_is_stale(tmp_path, monkeypatch, capsys):
    assert statements.main(["--check"]) == 0
    stale = tmp_path / "sqlitetext.py"
    stale.write_text(statements.TARGET.read_text().replace("'launching'", "'launchin'").replace('"launching"',
                                                                                               '"launchin"'))
    monkeypatch.setattr(statements, "TARGET", stale)
    assert statements.main(["--check"]) == 1 and "is stale" in capsys.readouterr().err
    assert statements.main([]) == 2


def test_every_statement_runs_on_a_db_at_the_schema_head(db, cfg):
    """Each generated text prepares on a real DB made by the migrations, with exactly the parameters it names."""
    import re
    import sqlite3

    from orchestrator.core.config import sqlite_path

    conn = sqlite3.connect(sqlite_path(cfg.db_url))
    try:
        for name, text in sqlitetext.SQL.items():
            names = set(re.findall(r":(\w+)", text))
            assert set(sqlitetext.CONSTANTS.get(name, {})) <= names, name
            conn.execute("EXPLAIN " + text, dict.fromkeys(names))  # prepares it: every table and column exists
    finally:
        conn.close()


def test_no_write_is_spelled_by_hand_in_the_quick_path():
    """A string holding an SQL write in a quick-path module is hand-written SQL the generator does not check."""
    for rel in QUICK:
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                upper = node.value.upper().lstrip()
                assert not upper.startswith(SQL_WORDS), f"{rel}:{node.lineno}: {node.value[:60]!r}"


def test_the_generated_module_imports_nothing_but_typing():
    p = subprocess.run([sys.executable, "-c", "import sys, orchestrator.core.sqlitetext; "
                        "print(sorted(m for m in sys.modules if m.startswith('sqlalchemy')))"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_no_update_names_a_parameter_after_a_column_of_its_table():
    """SQLAlchemy takes an execution parameter named as a column of the updated table for a SET value of its own
    (CompileError, "bindparam() name 'fence' is reserved"): the SQLAlchemy executor could not run that statement."""
    from sqlalchemy.sql.dml import Update

    for name, build in statements._statements().items():
        stmt = build()
        if isinstance(stmt, Update):
            given = {b.key for b in stmt._get_embedded_bindparams() if b.required}
            assert not given & set(stmt.table.c.keys()), (name, given & set(stmt.table.c.keys()))


def test_a_sweeps_name_check_reads_any_number_of_names_in_one_statement(db, cfg):
    """2,000 names (past SQLite's 999 bound parameters of old) in one parameter: exactly the taken ones come back."""
    import sqlite3

    from orchestrator.core.config import sqlite_path
    from orchestrator.core.lifecycle import JobState, create_job
    from orchestrator.core.models import Sweep
    from orchestrator.core.quickdb import run

    with db.write() as s:
        create_job(s, JobState.PENDING, name="n-1500", backend="local", run_dir="/r", command=["x"], resources={},
                   outputs=[], max_attempts=1)
        s.add(Sweep(name="n-7", backend="local", params={}))
    names = [f"n-{i}" for i in range(2000)] + ["it's \"quoted\""]
    with sqlite3.connect(sqlite_path(cfg.db_url)) as c:
        assert sorted(r[0] for r in run(c, "any_names_taken", names=names)) == ["n-1500", "n-7"]
        assert run(c, "any_names_taken", names=[]).fetchall() == []


def test_the_quick_gate_sends_a_sqlite_without_json_functions_to_the_slow_path(db, cfg, monkeypatch):
    import sqlite3

    from orchestrator.core import quickdb

    class NoJson:
        def execute(self, sql, *args):
            raise sqlite3.OperationalError("no such function: json_valid")

    assert quickdb.has_json(NoJson()) is False
    assert quickdb.QuickDB.open(cfg) is not None
    monkeypatch.setattr(quickdb, "has_json", lambda conn: False)
    assert quickdb.QuickDB.open(cfg) is None
