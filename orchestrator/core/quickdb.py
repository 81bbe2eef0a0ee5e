"""The job table on stdlib ``sqlite3``, for the commands that must not import SQLAlchemy (~0.25 s of CPU, more
than ``orch submit``'s whole latency goal on a login node).

Only a DB the SQLAlchemy path would leave as it is gets through the gate: a regular, non-empty file of ours
that others cannot read, in a private home, in WAL mode, at the schema head (``schema.SCHEMA_HEAD``). Anything
else (a DB to create, upgrade or tighten, PostgreSQL, any sqlite3 error at the gate) returns None and the caller
takes the SQLAlchemy path, which creates, upgrades, tightens or reports as every command does. Errors after the
gate are the ones ``db.Database`` raises, with the same words. Why a second path at all:
docs/decisions/0004-read-commands-without-sqlalchemy.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator import testhooks
from orchestrator.core import holdstop
from orchestrator.core.config import Config, sqlite_path
from orchestrator.core.schema import SCHEMA_HEAD
from orchestrator.core.sqlitetext import CONSTANTS, JSON_PARAMS, SQL
from orchestrator.errors import DatabaseInterrupted, DatabaseProblem

_LOOK_MS = 250  # a writer waiting for the lock looks at its holder this often (one read of /proc/locks)


def home_is_private(home: Path) -> bool:
    """What ``db.prepare_home`` would leave unchanged: our own 0700 directory, not a symlink."""
    try:
        st = os.lstat(home)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not stat.S_IMODE(st.st_mode) & 0o077


def connect(cfg: Config) -> sqlite3.Connection | None:
    """A connection (autocommit: the caller says BEGIN) to a DB that passes the gate's file checks, or None."""
    db_file = sqlite_path(cfg.db_url)
    if db_file is None or not home_is_private(cfg.home):
        return None
    try:
        st = os.lstat(db_file)  # a symlink goes to the slow path, which refuses it (hostile: read commands followed it)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # absent, empty or not private: the slow path creates, upgrades or tightens it
        conn = sqlite3.connect(db_file, timeout=cfg.busy_timeout_ms / 1000, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout={int(cfg.busy_timeout_ms)}")
    except (OSError, sqlite3.Error):
        return None
    return conn


def run(c: sqlite3.Connection | sqlite3.Cursor, statement: str, /, **values: Any) -> sqlite3.Cursor:
    """``statement`` (``ops/statements.py``, its text generated into ``core/sqlitetext.py``) with the caller's
    parameters, by name, and its own constants. Test site ``quick:<statement>``: right after it ran, uncommitted."""
    cur = c.execute(SQL[statement], _bound(statement, values))
    testhooks.site(f"quick:{statement}")
    return cur


def run_many(c: sqlite3.Connection | sqlite3.Cursor, statement: str, rows: Iterable[dict[str, Any]]) -> sqlite3.Cursor:
    """``statement`` once per row of parameters (``executemany``: its rowcount is the total)."""
    memo: dict[int, str] = {}
    cur = c.executemany(SQL[statement], [_bound(statement, row, memo) for row in rows])
    testhooks.site(f"quick:{statement}")
    return cur


def _bound(statement: str, values: dict[str, Any], memo: dict[int, str] | None = None) -> dict[str, Any]:
    """The parameters ``statement`` runs with: its constants and ``values``, those bound to a JSON column as text, as
    ``models.JSONType`` writes it (times: the datetime adapter below). ``memo``: the text of each value object already
    encoded in this batch (a sweep's tasks share one resources dict)."""
    out = {**CONSTANTS.get(statement, {}), **values}
    for k in JSON_PARAMS.get(statement, ()):
        v = out.get(k)
        if v is None:
            continue
        text = memo.get(id(v)) if memo is not None else None
        if text is None:
            text = json.dumps(v, sort_keys=True, default=str)
            if memo is not None:
                memo[id(v)] = text  # the rows hold v until the batch ran: its id is not reused meanwhile
        out[k] = text
    return out


class SqliteExecutor:
    """``core/transactions.py``'s executor on a sqlite3 connection: the generated text, times stored as the
    SQLAlchemy path stores them."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def rowcount(self, statement: str, /, **values: Any) -> int:
        return run(self.conn, statement, **values).rowcount

    def rowcount_many(self, statement: str, rows: Sequence[dict[str, Any]], /) -> int:
        return run_many(self.conn, statement, rows).rowcount if rows else 0

    def inserted(self, statement: str, /, **values: Any) -> int:
        row_id = run(self.conn, statement, **values).lastrowid
        assert row_id is not None, statement
        return row_id

    def rows(self, statement: str, /, **values: Any) -> list[tuple[Any, ...]]:
        return run(self.conn, statement, **values).fetchall()


def at_revision(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return row is not None and row[0] == SCHEMA_HEAD


def has_json(conn: sqlite3.Connection) -> bool:
    """SQLite's JSON functions are there (built in since 3.38; a compile option before): a sweep's name check
    reads its names with json_each."""
    try:
        conn.execute("SELECT json_valid('[]')")
    except sqlite3.OperationalError:
        return False
    return True


def stored_time(t: datetime) -> str:
    """A naive UTC time as SQLAlchemy stores it in SQLite (and compares it there: as text)."""
    return t.isoformat(" ", "microseconds")


# A datetime bound by sqlite3 is stored as SQLAlchemy stores it (always with microseconds: times compare as text);
# Python's own adapter (deprecated since 3.12) left them out when zero. Once per value, in the driver: converting
# each row's times in Python first was a dict per row, most of a 1,000-task sweep's extra time in its statements.
sqlite3.register_adapter(datetime, functools.lru_cache(maxsize=64)(stored_time))  # a batch binds one time per row


def read_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


class QuickDB:
    """One writer connection with the pragmas ``db.make_engine`` sets; ``write()`` is BEGIN IMMEDIATE."""

    def __init__(self, cfg: Config, conn: sqlite3.Connection) -> None:
        self.cfg, self.conn = cfg, conn
        self.path = sqlite_path(cfg.db_url)

    @classmethod
    def open(cls, cfg: Config) -> QuickDB | None:
        """Through the gate, or None: take the SQLAlchemy path."""
        conn = connect(cfg)
        if conn is None:
            return None
        try:
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() != "wal" or not at_revision(conn) or not has_json(conn):
                conn.close()
                return None
        except sqlite3.Error:
            conn.close()
            return None
        return cls(cfg, conn)

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction, committed on success; sqlite3 errors raised as ``db.Database`` raises them."""
        with holdstop.held():  # a Ctrl-Z inside would hold every other writer
            begin_immediate(self.conn, self.cfg, self.path)
            try:
                with self._mapped():
                    yield self.conn
                    self.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One snapshot for the reads inside."""
        with self._mapped():
            self.conn.execute("BEGIN")
        try:
            with self._mapped():
                yield self.conn
        finally:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as e:
            raise db_error(self.cfg, self.path, e) from None
        except sqlite3.DatabaseError as e:
            raise DatabaseProblem(f"database {self.path} is unusable: {_first_line(e)}") from None


def begin_immediate(conn: sqlite3.Connection, cfg: Config, path: Path | None) -> None:
    """BEGIN IMMEDIATE, waiting up to the busy timeout for another writer, but never for a stopped one: it
    cannot let go. Raises ``db.Database``'s errors.

    A hostile pass: an ``orch sweep`` stopped (kill -STOP, Ctrl-Z) inside one of its many short write
    transactions made every submit and reconcile wait the whole 30 s busy timeout, then fail."""
    deadline = time.monotonic() + cfg.busy_timeout_ms / 1000
    try:
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            look_ms = _LOOK_MS if path is not None else left_ms  # no file, no holder to look at
            conn.execute(f"PRAGMA busy_timeout={max(0, min(look_ms, left_ms))}")
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if not is_locked(e) or left_ms <= look_ms or path is None:
                    raise db_error(cfg, path, e) from None
                _refuse_a_stopped_writer(cfg, path)
    finally:
        with contextlib.suppress(sqlite3.Error):  # the statements inside wait as long as ever
            conn.execute(f"PRAGMA busy_timeout={int(cfg.busy_timeout_ms)}")


def _refuse_a_stopped_writer(cfg: Config, path: Path) -> None:
    from orchestrator import filelock

    pid = filelock.sqlite_writer_pid(path)
    if pid is not None and filelock.is_stopped(pid):
        raise DatabaseInterrupted(f"database {path} is locked by {filelock.sqlite_writer(path)}; not waited for: "
                                  f"a stopped writer cannot let go (resume it with kill -CONT {pid}, or end it)")


def db_error(cfg: Config, path: Path | None, e: Exception) -> DatabaseProblem:
    """``db.Database``'s error for a driver's OperationalError ``e`` on the SQLite file ``path``."""
    from orchestrator import filelock

    if is_full(e):
        return DatabaseInterrupted(f"database {path}: {_first_line(e)}")
    if is_locked(e):
        return locked_error(cfg, str(path), (filelock.sqlite_writer(path) if path is not None else ""))
    return DatabaseProblem(f"database {path}: {_first_line(e)}")


def is_full(e: Exception) -> bool:
    return "disk is full" in str(e)  # SQLITE_FULL: a later pass may find room again


def is_locked(e: Exception) -> bool:
    return any(w in str(e) for w in ("locked", "busy", "lock timeout"))  # SQLite / PostgreSQL


def locked_error(cfg: Config, where: str, holder: str) -> DatabaseInterrupted:
    """The DB stayed locked past the busy timeout; ``holder``: who holds the write lock ('' if unknown)."""
    return DatabaseInterrupted(f"database {where} is locked by {holder or 'another writer'} for longer than "
                               f"{cfg.busy_timeout_ms} ms; try again")


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__
