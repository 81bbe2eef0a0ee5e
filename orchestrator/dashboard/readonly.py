"""A database handle that cannot write: what the dashboard reads through.

The views take a ``Database`` and only ever call ``read()``; this gives them one whose connections the database
itself refuses to write on (SQLite opened ``mode=ro``; PostgreSQL sessions ``default_transaction_read_only``), so
a bug in a page, or a request crafted to reach a write, cannot change the job table.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.core.config import Config, sqlite_path
from orchestrator.core.db import Database, describe
from orchestrator.errors import DatabaseProblem


class ReadOnlyDatabase(Database):
    """``Database``'s read side on a read-only engine; ``write()`` raises. Made after a normal ``Database`` has
    created or upgraded the schema (``orch dashboard`` opens one first, as every command does)."""

    def __init__(self, cfg: Config) -> None:  # no super().__init__(): it would create and migrate
        self.cfg = cfg
        self.engine = readonly_engine(cfg)
        self.identity = None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = self._sessions

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        raise DatabaseProblem(f"database {describe(self.cfg)}: the dashboard never writes")
        yield  # pragma: no cover - a generator, for contextmanager


def readonly_engine(cfg: Config) -> Engine:
    """An engine whose connections cannot write (see the module docstring)."""
    url = cfg.db_url
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is None:
            raise DatabaseProblem("the dashboard reads a database file or PostgreSQL, not an in-memory database")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=cfg.busy_timeout_ms / 1000,
                                   check_same_thread=False)
            conn.isolation_level = None
            conn.execute(f"PRAGMA busy_timeout={int(cfg.busy_timeout_ms)}")
            conn.execute("PRAGMA query_only=ON")  # a second lock: no statement may write on this connection
            return conn

        engine = create_engine("sqlite://", creator=connect)

        @event.listens_for(engine, "begin")
        def _begin(conn):  # SQLAlchemy's BEGIN with isolation_level None: a deferred read transaction
            conn.exec_driver_sql("BEGIN")

        return engine
    return create_engine(url, pool_pre_ping=True, connect_args={
        "options": f"-c default_transaction_read_only=on -c lock_timeout={max(1, int(cfg.busy_timeout_ms))}"})
