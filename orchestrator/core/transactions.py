"""Transactions written once, run by either executor: SQLAlchemy's (any database, ``ops.statements.SessionExecutor``)
or stdlib sqlite3's (the quick path, ``quickdb.SqliteExecutor``).

Each function here takes an :class:`Executor` inside the caller's open transaction, and runs statements of
``ops/statements.py`` by name. The two paths used to spell the same transaction twice (a SQLAlchemy update here, a
hand-written string there); now a change is made once, and ``tests/unit/test_transactions.py`` runs each function on
both executors against the same rows. Stdlib only: the quick path imports it without SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol


class Executor(Protocol):
    """Runs a statement of ``ops/statements.py`` by name, its parameters by name (a time as a naive UTC datetime)."""

    def rowcount(self, statement: str, /, **values: Any) -> int:
        """Run ``statement``; the number of rows it changed."""
        ...


def renew_claims(ex: Executor, claims: Iterable[tuple[int, int]], now: datetime) -> set[int]:
    """claimed_at = ``now`` for each (attempt id, fence) whose attempt is still ``launching`` under that fence;
    the ids still held (a claim another launcher took, or a cancel ended, is not renewed)."""
    return {attempt_id for attempt_id, fence in claims
            if ex.rowcount("renew", now=now, attempt_id=attempt_id, held_fence=fence) == 1}
