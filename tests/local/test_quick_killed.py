"""`orch submit`'s quick path (stdlib sqlite3) killed right after each of its statements, as a kill -9 would
(``ORCH_FAULT=quick:<statement>``: ``os._exit`` inside the statement's transaction, before its commit). What the
commits before it left, the SQLAlchemy path (``orch reconcile``) recovers: the job runs exactly once and verifies.
Killed before its rows were committed, no row of it exists, and the same submission, made again, runs it once.
"""

from __future__ import annotations

import pytest
from localkit import ONCE, assert_ran_once, db_rows, reconcile_until_verified

# Each statement of one quick submission, in the order it runs, and whether the job's rows were committed before it
BEFORE_ROWS = ["job_state", "names_taken", "environment", "new_environment", "new_job", "new_attempt"]
AFTER_ROWS = ["mtbf_history", "claim", "event", "check_claim", "record", "job_submitted"]


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
