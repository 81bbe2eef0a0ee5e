"""`orch submit` killed right after each statement its executor runs, as a kill -9 would (``ORCH_FAULT=
quick:<statement>`` on the quick path's stdlib sqlite3, ``sqlalchemy:<statement>`` on the SQLAlchemy path's executor:
``os._exit`` inside the statement's transaction, before its commit). What the commits before it left, ``orch
reconcile`` recovers: the job runs exactly once and verifies. Killed before its rows were committed, no row of it
exists, and the same submission, made again, runs it once.
"""

from __future__ import annotations

import pytest
from localkit import ONCE, assert_ran_once, db_rows, reconcile_until_verified

# Statements of one quick submission, in the order they run, and whether the job's rows were committed before each:
# a read before the first write transaction, then the first and last statement of that transaction (a kill inside
# it at any statement rolls it back whole), then each one after
BEFORE_ROWS = ["job_state", "new_environment", "new_attempt"]
AFTER_ROWS = ["mtbf_history", "claim", "event", "check_claim", "record", "job_submitted"]
# The statements the SQLAlchemy path's executor runs in one submission (core/transactions.py), after its rows exist
SQLALCHEMY_STATEMENTS = ["claim", "event", "check_claim", "record", "job_submitted"]


def _submit(orch, env: dict[str, str] | None = None):
    return orch("submit", "--name", "once", "--outputs", "result/*", "--", "bash", "-c", ONCE, env=env or {})


@pytest.mark.parametrize("statement", BEFORE_ROWS + AFTER_ROWS)
def test_a_quick_submit_killed_after_any_statement_runs_the_job_exactly_once(orch, statement):
    orch("status", check=True)  # the DB exists at the schema head: the submission takes the quick path
    p = _submit(orch, {"ORCH_FAULT": f"quick:{statement}"})
    assert p.returncode == 99, (statement, p.stdout, p.stderr)  # the quick path ran it, and died there
    if statement in BEFORE_ROWS:
        assert db_rows(orch.home, "SELECT name FROM jobs") == []  # rolled back whole
        assert _submit(orch).returncode == 0
    else:
        assert db_rows(orch.home, "SELECT state FROM jobs") == [("pending",)]
    reconcile_until_verified(orch, "once")
    assert_ran_once(orch, "once")


@pytest.mark.parametrize("statement", SQLALCHEMY_STATEMENTS)
def test_a_sqlalchemy_submit_killed_after_any_statement_of_its_transactions_runs_the_job_exactly_once(orch, statement):
    p = orch("submit", "--json", "--name", "once", "--outputs", "result/*", "--", "bash", "-c", ONCE,
             env={"ORCH_FAULT": f"sqlalchemy:{statement}"})  # --json: the SQLAlchemy path
    assert p.returncode == 99, (statement, p.stdout, p.stderr)
    assert db_rows(orch.home, "SELECT state FROM jobs") == [("pending",)]
    reconcile_until_verified(orch, "once")
    assert_ran_once(orch, "once")
