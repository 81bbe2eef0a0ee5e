"""Engine, sessions and schema upgrades for the job table.

SQLite (the default) gets WAL, a busy timeout and foreign keys on every connection, so cron
reconcilers and a user's commands can overlap without "database is locked". PostgreSQL (ORCH_DB_URL)
gets the same busy timeout as its lock_timeout, and advisory locks where SQLite's one-writer-at-a-time
was all that kept two writers apart (schema upgrades, new names). The schema is born and changed only
by Alembic; the common case (already at head) is checked with one SELECT so that read commands do not
pay for importing Alembic on a login node.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator import filelock
from orchestrator.core import holdstop
from orchestrator.core.config import Config
from orchestrator.core.config import sqlite_path as _sqlite_path
from orchestrator.core.quickdb import begin_immediate, is_full, is_locked, locked_error
from orchestrator.core.schema import SCHEMA_HEAD
from orchestrator.errors import DatabaseInterrupted, DatabaseProblem, Refused, UsageError

SQLITE_APPLICATION_ID = 0x6F726368  # "orch" in the header of a DB file orch created
MIGRATE_LOCK_TIMEOUT_S = 300.0  # a first command waits this for another one's schema upgrade (or ORCH_LOCK_TIMEOUT_S)
MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"  # orchestrator/migrations (a link to alembic/)
# PostgreSQL advisory lock keys ("orch", "orcn"): schema upgrades of one DB; creators of job/sweep names.
PG_MIGRATE_LOCK = 0x6F726368
PG_NAMES_LOCK = 0x6F72636E


def prepare_home(cfg: Config) -> None:
    """Create ORCH_HOME (0700) and the SQLite file (0600): a shared login node must not expose them.

    An existing ORCH_HOME of ours that others can read is tightened to 0700 (a home made
    0755 by hand left every run dir and log readable); one owned by someone else is refused.
    """
    try:
        cfg.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(cfg.home)
    except OSError as e:
        raise UsageError(f"ORCH_HOME {cfg.home} is unusable: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"ORCH_HOME {cfg.home} is a symlink or not a directory")
    if st.st_uid != os.geteuid():
        raise Refused(f"refused: ORCH_HOME {cfg.home} belongs to uid {st.st_uid}, not to you")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(cfg.home, 0o700)
    p = _sqlite_path(cfg.db_url)
    if p is None:
        return
    if p.is_symlink() and p == cfg.home / "orch.db":
        # A (dangling) link at the default DB path put the DB outside ORCH_HOME (hostile test); a DB
        # kept elsewhere is what ORCH_DB_URL is for.
        raise UsageError(f"{p} is a symlink; orch keeps its DB in ORCH_HOME (set ORCH_DB_URL to use one elsewhere)")
    if not p.exists():
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _create_sqlite_file(p)
    with contextlib.suppress(OSError):  # a DB file made by hand (0644) holds every job's command line
        st = os.stat(p)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(p, 0o600)


def _create_sqlite_file(path: Path) -> None:
    """Make the SQLite file appear already in WAL mode, with its first page written, or not at all.

    Born empty, a DB is switched to WAL by whichever first command's connection gets there first, and
    the others' ``PRAGMA journal_mode=WAL`` got "database is locked" at once, the busy timeout not
    applying (CI: 1 of 4 concurrent first ``orch status`` failed). A private temporary file is set up
    alone and linked into place; a racer that links first wins and ours is dropped.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a crashed creator's leftover of the same pid (or a planted link: never followed)
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # persistent: recorded in the file's header
            conn.execute(f"PRAGMA application_id={SQLITE_APPLICATION_ID}")  # a write: page 1 exists
        finally:
            conn.close()  # the only connection: checkpoints and removes the temporary -wal/-shm
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another first command won
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            # A filesystem without hard links: born empty after all; _set_wal waits out the race.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    except (OSError, sqlite3.Error) as e:
        raise UsageError(f"cannot create the database {path}: {e}") from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with contextlib.suppress(OSError):  # its own error must not replace the one being raised
                os.unlink(leftover)


def db_identity(cfg: Config) -> tuple[int, int] | None:
    """(device, inode) of the SQLite file, or None (not SQLite, or the file is gone)."""
    p = _sqlite_path(cfg.db_url)
    if p is None:
        return None
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def make_engine(cfg: Config) -> Engine:
    sqlite = cfg.db_url.startswith("sqlite")
    kwargs = {"connect_args": {"timeout": cfg.busy_timeout_ms / 1000}} if sqlite else {}
    if cfg.db_url.startswith("postgresql"):
        # busy_timeout_ms means the same there: a wait for another writer's lock (a row, the names
        # lock) ends in the "locked" error instead of hanging every reconciler behind a stuck one.
        kwargs = {"connect_args": {"options": f"-c lock_timeout={max(1, int(cfg.busy_timeout_ms))}"}}
    if not sqlite:
        # A server restart (or a proxy dropping idle connections) leaves `reconcile --watch` holding
        # dead pooled connections: test each on checkout and reconnect, instead of stopping the loop.
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(cfg.db_url, **kwargs)
    except (ImportError, NoSuchModuleError) as e:  # NoSuchModuleError is an ArgumentError too
        scheme = cfg.db_url.split(":", 1)[0]
        hint = "; orch's postgres extra installs psycopg: postgresql+psycopg://" if "postgres" in scheme else ""
        raise UsageError(f"ORCH_DB_URL {scheme}://...: no driver for it ({e}){hint}") from None
    except ArgumentError:  # its message would echo the URL, password and all
        raise UsageError("ORCH_DB_URL is not a database URL (dialect+driver://user:password@host:port/dbname)") \
            from None
    if sqlite:
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            # Let SQLAlchemy's transaction control issue BEGIN; we issue BEGIN IMMEDIATE ourselves
            # for writers so that two writers never deadlock upgrading a read lock.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(cfg.busy_timeout_ms)}")
            _set_wal(cur, cfg.busy_timeout_ms)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            if conn.get_execution_options().get("orch_write"):
                begin_immediate(conn.connection.dbapi_connection, cfg, _sqlite_path(cfg.db_url))
            else:
                conn.exec_driver_sql("BEGIN")
    return engine


def _set_wal(cur: sqlite3.Cursor, timeout_ms: int) -> None:
    """WAL, waiting for it as for any lock: switching a DB that is not yet in WAL mode (an empty file
    someone else made) answers "database is locked" at once, without the busy handler."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def _current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        try:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except (OperationalError, ProgrammingError) as e:  # no such table: SQLite / PostgreSQL
            if "no such table" in str(e) or "does not exist" in str(e):
                return None
            raise


def alembic_config(engine: Engine):  # alembic imported lazily
    from alembic.config import Config as AlembicConfig

    acfg = AlembicConfig()
    # Alembic's config is an ini file: a `%` in a path or a password would be read as interpolation.
    acfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    acfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return acfg


def upgrade(engine: Engine) -> None:
    from alembic import command

    acfg = alembic_config(engine)
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            # A migration that rebuilds a table (SQLite's batch mode drops the old one) must not
            # cascade the drop to its children: foreign keys off for the upgrade (outside any
            # transaction, where SQLite honours the pragma), on again for everything else.
            conn.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                acfg.attributes["connection"] = conn
                command.upgrade(acfg, "head")
        finally:
            if engine.dialect.name == "sqlite":
                conn.connection.driver_connection.execute("PRAGMA foreign_keys=ON")


def ensure_schema(cfg: Config, engine: Engine) -> None:
    """Bring the DB to the head revision; cheap when it already is."""
    try:
        if _current_revision(engine) == SCHEMA_HEAD:
            return
        with _migrate_lock(cfg, engine):
            if (rev := _current_revision(engine)) != SCHEMA_HEAD:  # another process may have done it meanwhile
                from alembic.util import CommandError

                try:
                    upgrade(engine)
                except CommandError as e:  # e.g. a revision this orch does not have: never guess, refuse
                    raise DatabaseProblem(f"database {describe(cfg)} is at schema revision {rev!r}, which this "
                                          f"orch cannot upgrade to {SCHEMA_HEAD} (written by a newer orch?): "
                                          f"{str(e)[:200]}") from None
    except DatabaseError as e:
        raise DatabaseProblem(f"database {describe(cfg)} is unusable: {_short(e)}") from None


@contextlib.contextmanager
def _migrate_lock(cfg: Config, engine: Engine) -> Iterator[None]:
    """One upgrader at a time: a lock file next to a SQLite DB; a session advisory lock on PostgreSQL,
    where several hosts' first commands may upgrade a shared empty DB at once (without it, 3 of 4
    concurrent first ``orch status`` failed: duplicate key in pg_type, their CREATE TABLEs racing)."""
    path = _sqlite_path(cfg.db_url)
    if path is not None:
        # Bounded like every lock (a stopped upgrader hung every first command), but long: an upgrade
        # of a big history may take minutes.
        with filelock.exclusive(path.with_suffix(".migrate.lock"), DatabaseProblem, "the migrate lock ",
                                timeout_s=filelock.lock_timeout_s(MIGRATE_LOCK_TIMEOUT_S)):
            yield
    elif engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_MIGRATE_LOCK})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_MIGRATE_LOCK})
                conn.commit()
    else:
        yield


def lock_names(s: Session) -> None:
    """Serialise the creators of job and sweep names until this write transaction ends.

    Names are one namespace over two tables, so no unique index guards "check, then insert". SQLite's
    BEGIN IMMEDIATE already makes writers take turns; PostgreSQL's READ COMMITTED does not: two
    submits of one name both passed the check and the later INSERT failed on the unique index (exit 1,
    "database unusable") instead of being refused, and a job and a sweep of one name both got in.
    """
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_NAMES_LOCK})


def describe(cfg: Config) -> str:
    p = _sqlite_path(cfg.db_url)
    return str(p) if p else cfg.db_url.split("@")[-1]


def _short(e: Exception) -> str:
    return str(getattr(e, "orig", e)).splitlines()[0][:200]


class Database:
    """One per process: engine + session factory, schema at head."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.engine = make_engine(cfg)  # a bad ORCH_DB_URL is refused before anything is created
        prepare_home(cfg)
        ensure_schema(cfg, self.engine)
        self.identity = db_identity(cfg)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self.engine.execution_options(orch_write=True),
                                            expire_on_commit=False)

    def check_identity(self) -> None:
        """Raise DatabaseProblem if the SQLite file was deleted or replaced since this process opened
        it: a long-running ``reconcile --watch`` must not carry on against a DB that is no longer the
        one users see, nor quietly create a new empty one."""
        if self.identity is None:
            return
        now = db_identity(self.cfg)
        if now != self.identity:
            what = "deleted" if now is None else "replaced"
            raise DatabaseProblem(f"database {describe(self.cfg)} was {what} while this process used it; "
                                  "stopping (restart to use the new one)")

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        with self._guard(), self._sessions() as s:
            yield s

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), committed on success."""
        with self._guard(), holdstop.held(), self._write_sessions() as s:  # Ctrl-Z waits for the commit
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def _writer(self) -> str:
        """Who holds the write lock, where it can be found (a stopped writer was named by nobody)."""
        path = _sqlite_path(self.cfg.db_url)
        return filelock.sqlite_writer(path) if path is not None else ""

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except OperationalError as e:
            if is_full(e):
                raise DatabaseInterrupted(f"database {describe(self.cfg)}: {_short(e)}") from None
            if is_locked(e):
                raise locked_error(self.cfg, describe(self.cfg), self._writer()) from None
            if e.connection_invalidated:  # the dialect saw a disconnect: the next checkout reconnects
                raise DatabaseInterrupted(f"database {describe(self.cfg)}: connection lost ({_short(e)})") from None
            raise DatabaseProblem(f"database {describe(self.cfg)}: {_short(e)}") from None
        except DatabaseError as e:
            raise DatabaseProblem(f"database {describe(self.cfg)} is unusable: {_short(e)}") from None
